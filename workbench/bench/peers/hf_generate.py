"""`transformers` as a benchmark peer, in this process: `generate` and `generate_batch`.

Owned here: loading the checkpoint with EOS disabled (ignore_eos semantics), and two runners
that take the offline workload and return each request's greedy token ids.

* `generate` (static batches): requests are cut, in workload order, into batches of
  `batch_size` (16), left-padded, and each batch runs `model.generate` to the batch's largest
  `max_tokens` (generate takes one `max_new_tokens` per call). Row i keeps only its first
  `max_tokens[i]` tokens, and only those count as output tokens: the extra tokens a short
  request computes while its batch finishes are the price of static batching.
* `generate_batch` (continuous batching): the manager API of transformers 5.24,
  `model.init_continuous_batching(...)` then `add_request(ids, max_new_tokens=n)` per request,
  so each request stops at its own length (`model.generate_batch(inputs)` takes one
  `max_new_tokens` for all). Block sharing (prefix caching) is off so repeated timed runs do
  not hit the cache, matching vLLM's reset between runs; the flash decode path (CUDA only)
  is off. On CPU its attention is one varlen SDPA call over every request's gathered KV with
  a dense [query tokens, all keys] mask, so a decode step costs ~batch^2: at 64 requests the
  attention is ~6x the matmul FLOPs, at 16 about equal. Hence `CB_BEST` caps the batch at 16
  requests. Tuning on the bench workload (64 requests, fp32, 2 AVX-512 cores; only runs
  during which other processes used <= 4% of the CPUs; this machine is shared and noisy):

    attention    page  max_batch_tokens  max_requests  output tok/s
    sdpa           64               512            16  303, 279
    sdpa           64               256            16  293, 291, 234, 176
    sdpa           64               256            32  282, 274
    sdpa           64               512            64  258, 230
    sdpa          256              1024            64  220
    sdpa           64               128             8  214
    paged|eager    64               512            64  104 (8% others)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from workbench.harness.offline_workload import OfflineRequest

# Measured best on the bench workload (see the module docstring).
CB_BEST: dict[str, Any] = {"attn_implementation": "sdpa", "page_size": 64,
                           "max_batch_tokens": 512, "max_requests": 16}


def load_hf_model(
    ckpt_dir: str | Path,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Any:
    """The checkpoint in `dtype` (fp32 on CPU) on `device`, eval mode, EOS disabled in its
    generation config."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(ckpt_dir), dtype=dtype, attn_implementation=attn_implementation
    )
    # transformers types `to` as @wraps(nn.Module.to) on the class, an unbound _Wrapped to mypy
    cast(torch.nn.Module, model).to(device)
    model.eval()
    disable_eos(model)
    return model


def disable_eos(model: Any) -> None:
    """ignore_eos for `generate`: it fills a passed config's unset fields from
    `model.generation_config`, so EOS is removed there, not only in the config we pass."""
    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    gc.temperature, gc.top_p, gc.top_k = None, None, None
    if gc.pad_token_id is None:
        gc.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0


def _greedy_config(model: Any, max_new_tokens: int) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=None,
        eos_token_id=None, pad_token_id=model.generation_config.pad_token_id,
        num_beams=1, use_cache=True,
    )


@torch.inference_mode()
def generate_static(
    model: Any, requests: Sequence[OfflineRequest], batch_size: int = 16
) -> list[list[int]]:
    """Greedy token ids per request, `batch_size` requests per left-padded `generate` call."""
    pad = int(model.generation_config.pad_token_id)
    outputs: list[list[int]] = []
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            n = len(r.prompt_token_ids)
            ids[i, width - n:] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            mask[i, width - n:] = 1
        steps = max(r.max_tokens for r in batch)
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             generation_config=_greedy_config(model, steps))
        for i, r in enumerate(batch):
            outputs.append(out[i, width:width + r.max_tokens].tolist())
    return outputs


@dataclass
class CBRunner:
    """A continuous-batching manager kept across timed runs (started once, like an engine)."""

    model: Any
    page_size: int = 64
    max_batch_tokens: int = 512
    num_blocks: int | None = None
    max_len: int = 512
    max_requests: int = 64  # max_requests_per_batch
    cache_requests: int = 64  # the KV cache holds this many max_len requests
    manager: Any = field(default=None, init=False)

    def start(self) -> None:
        from transformers import ContinuousBatchingConfig

        blocks = self.num_blocks or self.cache_requests * -(-self.max_len // self.page_size) + 8
        cfg = ContinuousBatchingConfig(
            page_size=self.page_size, num_blocks=blocks, max_batch_tokens=self.max_batch_tokens,
            max_requests_per_batch=self.max_requests, allow_block_sharing=False,
            max_blocks_per_request=0,  # the flash_attn_with_kvcache decode path needs CUDA
            auto_switch_to_flash=False,
        )
        gen = _greedy_config(self.model, 16)
        gen.eos_token_id = -1  # the manager's "disabled"
        self.manager = self.model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cfg)
        self.manager.start()

    @torch.inference_mode()
    def run(self, requests: Sequence[OfflineRequest], timeout_s: float = 600.0) -> list[list[int]]:
        if self.manager is None:
            self.start()
        mgr = self.manager
        rid = {mgr.add_request(list(r.prompt_token_ids), max_new_tokens=r.max_tokens,
                               eos_token_id=-1): i for i, r in enumerate(requests)}
        out: list[list[int] | None] = [None] * len(requests)
        pending, deadline = len(requests), time.monotonic() + timeout_s
        while pending:
            res = mgr.get_result(timeout=1)
            if res is None:
                if not mgr.is_running() or time.monotonic() > deadline:
                    raise RuntimeError(f"continuous batching stopped with {pending} requests left")
                continue
            if res.is_finished() and res.request_id in rid:
                if res.error is not None:
                    raise RuntimeError(f"request {res.request_id} failed: {res.error}")
                out[rid[res.request_id]] = list(res.generated_tokens)
                pending -= 1
        return [o if o is not None else [] for o in out]

    def stop(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=10)
            self.manager.destroy()
            self.manager = None
