"""The activation peak of a dummy forward, for the memory budget (`ModelRunner.profile_run`),
vLLM-style.

The batch is min(num_tokens, max_num_seqs x max_model_len) tokens of fresh prefills,
max_model_len tokens each (the last one shorter), written into a temporary KV cache (scales
not calibrated; allocated before measuring, so not counted), then the logits of
min(max_num_seqs, tokens) rows. CUDA: torch.cuda.max_memory_allocated() minus the allocated
bytes before the forward. CPU: the peak of the bytes of tensor storages the forward creates
while they are alive (`LiveTensorPeak`, a TorchDispatchMode); buffers kernels allocate
internally without a tensor are not seen. Must run before allocate_kv_cache (the temporary
cache is unbound afterwards).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.attention.metadata import AttentionMetadata
from workbench.config import EngineConfig
from workbench.core.kv_cache.utils import cdiv


class ProfiledRunner(Protocol):
    """What the profile run needs of a ModelRunner (no import of it: no cycle)."""

    config: EngineConfig
    block_size: int
    device: torch.device
    model: Any

    def allocate_kv_cache(self, num_blocks: int, calibrate: bool | None = None) -> None: ...

    def unbind_kv_cache(self) -> None: ...

    def build_batch(self, token_ids: list[int], starts: list[int], q_lens: list[int],
                    block_ids: list[list[int]]
                    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]: ...


def activation_peak(runner: ProfiledRunner, num_tokens: int, max_num_seqs: int) -> int:
    """Peak bytes of one dummy forward of `num_tokens` tokens on `runner` (see above)."""
    max_len = runner.config.model_config.max_model_len
    assert max_len is not None
    tokens = min(num_tokens, max_num_seqs * max_len)
    seq_len = min(max_len, tokens)
    lens = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
    tables, nxt = [], 1
    for n in lens:
        nb = cdiv(n, runner.block_size)
        tables.append(list(range(nxt, nxt + nb)))
        nxt += nb
    runner.allocate_kv_cache(nxt, calibrate=False)
    input_ids, positions, meta = runner.build_batch([0] * tokens, [0] * len(lens), lens, tables)
    num_rows = min(max_num_seqs, tokens)

    def forward() -> None:
        hidden = runner.model(input_ids, positions, meta)
        runner.model.compute_logits(hidden[-num_rows:])

    try:
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
            torch.cuda.reset_peak_memory_stats(runner.device)
            base = torch.cuda.memory_allocated(runner.device)
            forward()
            torch.cuda.synchronize(runner.device)
            peak = torch.cuda.max_memory_allocated(runner.device) - base
        else:
            with LiveTensorPeak(runner.device.type) as tracker:
                forward()
            peak = tracker.peak
    finally:
        runner.unbind_kv_cache()
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
    return int(peak)


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of the tensor storages created while active and still alive (CPU profiling).

    Every op's outputs on `device_type` whose storage is new (not one of the op's inputs, so
    views and in-place / out= writes into existing tensors do not count) are added when they
    appear and subtracted when their storage is freed (a weakref finalizer on the storage).
    So `peak` is the most bytes of tensors the traced code held at once, beyond what existed
    before (weights, the KV cache, inputs)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and not t.is_mkldnn}  # packed: opaque
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                continue
            storage = t.untyped_storage()
            key, nbytes = id(storage), storage.nbytes()
            if nbytes == 0 or key in self._live or storage.data_ptr() in inputs:
                continue
            self._finalizers.append(weakref.finalize(storage, self._free, key))
            self._live[key] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        return out

    def __exit__(self, *exc: Any) -> None:
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()
        return super().__exit__(*exc)
