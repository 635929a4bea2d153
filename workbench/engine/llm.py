"""LLM: the offline entry point (vLLM's `LLM` API) over one LLMEngine."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from os import PathLike
from typing import Any

from workbench.config import EngineConfig
from workbench.core.request import Request
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.outputs import (
    CompletionOutput,
    RequestMetrics,
    RequestOutput,
    collect_prompt_logprobs,
)
from workbench.engine.processor import PromptType
from workbench.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLM:
    """`LLM(model=folder, **engine knobs)`; see `workbench.config` for every knob."""

    def __init__(
        self, model: str | PathLike[str], disable_log_stats: bool = True, **kwargs: Any
    ) -> None:
        """`disable_log_stats=False` logs vLLM's periodic engine line (off by default, as
        vLLM's `LLM`)."""
        self.config = EngineConfig.from_kwargs(str(model), **kwargs)
        self.engine = LLMEngine(self.config, log_stats=not disable_log_stats)

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
        cache_salt: Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order.

        All prompts are validated before any is enqueued: a bad one raises ValueError
        (naming its index) and the engine, including requests already in it, is untouched.
        """
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        n = len(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params_list = [params] * n
        else:
            params_list = list(params)
            if len(params_list) != n:
                raise ValueError(
                    f"sampling_params has {len(params_list)} entries; it must be one "
                    f"SamplingParams or one per prompt ({n})"
                )
        for name, seq in (("priority", priority), ("cache_salt", cache_salt)):
            if seq is not None and len(seq) != n:
                raise ValueError(
                    f"{name} has {len(seq)} entries; it must have one per prompt ({n})"
                )
        engine = self.engine
        requests: list[Request] = []
        prompt_texts: list[str | None] = []
        for i, (p, sp) in enumerate(zip(prompts, params_list, strict=True)):
            try:
                req = engine.make_request(
                    p, sp, priority=priority[i] if priority else 0,
                    cache_salt=cache_salt[i] if cache_salt else None,
                )
            except ValueError as e:
                raise ValueError(f"prompts[{i}]: {e}") from None
            requests.append(req)
            prompt_texts.append(p if isinstance(p, str) else (
                p.get("prompt") if isinstance(p, dict) else None))
        for req in requests:
            engine.add_request(req)
        remaining = sum(r.sampling_params.n for r in requests)
        done: dict[str, list[Request]] = {r.request_id: [] for r in requests}
        try:
            while remaining:
                for req in engine.step():
                    if req.is_finished():
                        root = req.parent_id or req.request_id
                        if root in done:
                            done[root].append(req)
                            remaining -= 1
            connector = engine.scheduler.connector
            while connector is not None and connector.has_pending_work():
                engine.step()  # e.g. a prefill instance announces its held blocks
        except BaseException:
            # A bug escaping the step (or Ctrl-C): take this call's requests out of the
            # engine so the next generate() starts clean, then re-raise.
            ids = [r.request_id for r in requests]
            ids += [rid for rid, r in engine.scheduler.requests.items() if r.parent_id in done]
            engine.abort_request(ids)
            raise
        failed = [s for seqs in done.values() for s in seqs if s.error is not None]
        if failed:
            logger.warning("%d of %d sequences failed in the engine (finish_reason 'error'); "
                           "first: %s: %s", len(failed), sum(map(len, done.values())),
                           failed[0].request_id, failed[0].error)
        return [
            self._to_output(req, text, sorted(done[req.request_id], key=lambda r: r.index))
            for req, text in zip(requests, prompt_texts, strict=True)
        ]

    def _to_output(
        self, req: Request, prompt: str | None, seqs: list[Request]
    ) -> RequestOutput:
        tok = self.engine.tokenizer
        outs = []
        for s in seqs:
            outs.append(CompletionOutput(
                index=s.index,
                text=str(tok.decode(s.output_token_ids,  # one id list decodes to one str
                                    skip_special_tokens=s.sampling_params.skip_special_tokens)),
                token_ids=list(s.output_token_ids),
                finish_reason=s.status.finish_reason,
                stop_reason=s.stop_reason,
                metrics=RequestMetrics.from_request(s),
                error=s.error,
            ))
        return RequestOutput(
            request_id=req.request_id, prompt=prompt, prompt_token_ids=req.prompt_token_ids,
            outputs=outs, finished=True, metrics=outs[0].metrics if outs else None,
            prompt_logprobs_tensors=collect_prompt_logprobs(req),
            kv_transfer_params=req.kv_transfer_params,
        )

    def stats(self) -> dict[str, float]:
        return self.engine.stats.snapshot()

    def step_trace(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.engine.stats.step_trace]

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        return self.engine.reset_prefix_cache(reset_connector)

    def memory_readout(self) -> dict[str, Any]:
        return self.engine.memory_readout()

    def errors(self) -> list[dict[str, Any]]:
        """The newest failure records (step, scope = request | step | propose, request_ids,
        message), oldest first."""
        return list(self.engine.errors)

    @property
    def model_runner(self) -> Any:
        """Rank 0's model runner, for diagnostics that time or hook the forward (the device
        check's forward timer, the quantization benchmark's per-layer timing)."""
        return self.engine.runner

    def close(self) -> None:
        """Stop the tensor-parallel worker processes (tensor_parallel_size > 1); idempotent.
        Also done when the LLM is collected and at interpreter exit."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter teardown: nothing left to report to
            pass
