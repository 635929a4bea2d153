"""What one linear layer's forward costs in a model: dense, or dequantize + matmul.

    layer_timing(model, tokens=(1, 32), reps=20)     median microseconds of one forward of the
                                                     model's first `gate_up_proj` (else its
                                                     first linear layer) on t tokens, each t
    engine_layer_timing(model_folder, engine_kwargs, tokens)
                                                     the same on the model an engine of that
                                                     config loads (quantized as it says),
                                                     the engine closed after

A micro-measurement beside an experiment's runs: it explains a quantized variant's speed (on
a CPU every matmul dequantizes its weights first) rather than measuring serving.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import torch


def layer_timing(model: torch.nn.Module, tokens: tuple[int, ...] = (1, 32), reps: int = 20
                 ) -> dict[int, float]:
    """Median microseconds of one forward of the model's first `gate_up_proj` (else its
    first linear layer) on `t` tokens, for each t: dense, or dequantize + matmul."""
    from workbench.layers.linear import LinearBase

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LinearBase)]
    name, layer = next(((n, m) for n, m in layers if n.endswith("gate_up_proj")), layers[0])
    dtype = next(model.parameters()).dtype
    if not dtype.is_floating_point or dtype.itemsize < 2:
        dtype = torch.float32
    in_features = int(layer.input_size)
    out: dict[int, float] = {}
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, in_features, dtype=dtype)
            layer(x)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                layer(x)
                times.append(time.perf_counter() - t0)
            out[t] = statistics.median(times) * 1e6
    return out


def engine_layer_timing(model_folder: str, engine_kwargs: Mapping[str, Any],
                        tokens: tuple[int, ...] = (1, 32)) -> dict[int, float]:
    """`layer_timing` of the model `workbench.LLM(model_folder, **engine_kwargs)` loads."""
    from workbench import LLM

    llm = LLM(model_folder, **dict(engine_kwargs))
    try:
        return layer_timing(llm.model_runner.model, tokens)
    finally:
        llm.close()
