"""Processor (vLLM's `v1/engine/processor.py`): a prompt and its sampling params in, a
validated Request out. Tokenizes text prompts, checks token ids against the vocabulary,
lengths against max_model_len, `n` against max_num_seqs, and a request's kv_transfer_params
against the engine's KV connector; raises ValueError naming the field, enqueues nothing."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from workbench.config.kv_transfer_params import kv_transfer_params
from workbench.core.request import Request
from workbench.models.tokenizer import load_tokenizer
from workbench.sampling_params import SamplingParams, is_int

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.distributed.kv_transfer.base import KVConnectorBase_V1

PromptType = str | list[int] | dict[str, Any]


class Processor:
    def __init__(self, config: EngineConfig, connector: KVConnectorBase_V1 | None) -> None:
        """`connector`: the scheduler side of the KV connector (None without one)."""
        mc = config.model_config
        assert mc.max_model_len is not None
        self.max_model_len: int = mc.max_model_len
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        self.connector = connector
        self.tokenizer = load_tokenizer(mc.model)
        self.vocab_size = int(mc.hf_config["vocab_size"])
        eos = self.tokenizer.eos_token_id
        self.eos_token_id: int | None = (
            eos if eos is not None else (mc.eos_token_ids[0] if mc.eos_token_ids else None))
        self._ids = itertools.count()

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(the prompt text if there is one, its token ids)."""
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            raise ValueError(
                f"prompt dict keys ({sorted(prompt)}) must include 'prompt' or 'prompt_token_ids'"
            )
        if isinstance(prompt, list | tuple):
            return None, _token_ids(prompt)
        raise ValueError(
            f"prompt of type {type(prompt).__name__} is not allowed; pass a str, a list of "
            "token ids or {'prompt_token_ids': [...]}"
        )

    def make_request(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> Request:
        """Validate and build a Request (raises ValueError; nothing is enqueued)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params ({params!r}) must be a SamplingParams")
        _, ids = self.tokenize(prompt)
        self._check_prompt(ids)
        params.check_token_ids(self.vocab_size)
        self._check_kv_transfer(params)
        if params.n > self.max_num_seqs:
            raise ValueError(
                f"n ({params.n}) must be <= max_num_seqs ({self.max_num_seqs}): every "
                "sequence of a request runs as one scheduled sequence"
            )
        if not is_int(priority):
            raise ValueError(f"priority ({priority!r}) must be an integer")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt ({cache_salt!r}) must be a string or None")
        if arrival_time is not None and not (
            isinstance(arrival_time, int | float) and math.isfinite(arrival_time)
        ):
            raise ValueError(f"arrival_time ({arrival_time!r}) must be a finite number")
        rid = request_id if request_id is not None else str(next(self._ids))
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"request_id ({rid!r}) must be a non-empty string")
        return Request(
            request_id=rid, prompt_token_ids=ids, sampling_params=params,
            eos_token_id=self.eos_token_id, arrival_time=arrival_time, priority=priority,
            cache_salt=cache_salt,
        )

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty; at least one token is required")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"prompt (length {len(ids)}) is longer than max_model_len ({self.max_model_len})"
                "; shorten it or raise max_model_len"
            )
        for i, t in enumerate(ids):
            if not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompt_token_ids[{i}] ({t}) is out of range; allowed "
                    f"0..{self.vocab_size - 1} (the model's vocabulary)"
                )

    def _check_kv_transfer(self, params: SamplingParams) -> None:
        handshake = kv_transfer_params(params.extra_args)
        if not handshake:
            return
        if self.connector is not None:
            self.connector.check_request(handshake, params.n)
        elif handshake.get("do_remote_decode") or handshake.get("do_remote_prefill"):
            raise ValueError("kv_transfer_params do_remote_decode / do_remote_prefill "
                             "need an engine with a kv_transfer_config (kv_connector "
                             "'P2pConnector'); this one has none")


def _token_ids(ids: Any) -> list[int]:
    """Prompt token ids as plain ints; anything but a sequence of integers is refused
    (int() would silently truncate 3.7 or parse "3")."""
    if not isinstance(ids, list | tuple):
        raise ValueError(f"prompt_token_ids ({ids!r}) must be a list of token ids (ints)")
    for i, t in enumerate(ids):
        if not is_int(t):
            raise ValueError(f"prompt_token_ids[{i}] ({t!r}) must be an integer token id")
    return [int(t) for t in ids]
