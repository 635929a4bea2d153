"""The quantization knobs: validation with the field named, the serve flags, calc's formula."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench import LLM
from workbench.config import EngineConfig, QuantConfig
from workbench.config.named_models import resolve_model
from workbench.entrypoints.openai.cli_args import parse_args
from workbench.planning import quantized_weight_bytes

BUNDLED = Path(resolve_model("bundled"))  # hidden 64, intermediate 128


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantization": "int3"},
         r"quantization \('int3'\) must be None or one of 'int8', 'int4', 'fp8'"),
        ({"quantization": "INT8"}, r"quantization \('INT8'\) must be None or one of"),
        ({"quantization": "int4", "quantization_group_size": 48},
         r"quantization_group_size \(48\) must be one of 32, 64, 128"),
        ({"quantization": "int8", "quantization_group_size": 64},
         r"quantization_group_size \(64\) only applies to quantization='int4' "
         r"\(got quantization='int8'\)"),
        ({"quantization_group_size": 32},
         r"quantization_group_size \(32\) only applies to quantization='int4' "
         r"\(got quantization=None\)"),
    ],
)
def test_bad_quantization_knobs(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(BUNDLED, **kwargs)


def test_default_int4_group_does_not_fit_the_tiny_model() -> None:
    with pytest.raises(ValueError, match=r"quantization_group_size \(128\) must divide the "
                                         r"in_features of every quantized linear layer, but "
                                         r"model\.layers\.0\.self_attn\.qkv_proj has in_features "
                                         r"64 \(6 of 8 layers do not fit\); 32 or 64 would fit"):
        LLM(BUNDLED, quantization="int4", max_model_len=64, num_gpu_blocks_override=8)


def test_config_values() -> None:
    cfg = EngineConfig.from_kwargs(BUNDLED, quantization="int4")
    assert cfg.quantization == cfg.model_config.quantization == "int4"
    assert cfg.model_config.quant_config == QuantConfig("int4", 128)
    assert QuantConfig("int4", 64).options() == {"group_size": 64}
    assert QuantConfig("fp8").options() == {} and QuantConfig().method is None
    assert EngineConfig.from_kwargs(BUNDLED).quantization is None


def test_serve_flags() -> None:
    _, cfg = parse_args(["--model", str(BUNDLED), "--quantization", "int4",
                         "--quantization-group-size", "32"])
    assert cfg.model_config.quant_config == QuantConfig("int4", 32)


def test_calc_quantized_weight_bytes() -> None:
    # a 4096 x 4096 layer: 16 Mi params, 4096 rows
    n, rows = 4096 * 4096, 4096
    assert quantized_weight_bytes(n, rows, None, dtype_bytes=2) == 2 * n
    assert quantized_weight_bytes(n, rows, "int8") == n + 4 * rows
    assert quantized_weight_bytes(n, rows, "fp8") == n + 4 * rows
    assert quantized_weight_bytes(n, rows, "int4", group_size=128) == n // 2 + n // 128 * 8
    assert quantized_weight_bytes(n, rows, "int4", group_size=128) / n == 0.5625
    with pytest.raises(ValueError, match=r"quantization \('nf4'\) must be None or one of"):
        quantized_weight_bytes(n, rows, "nf4")
    with pytest.raises(ValueError, match=r"num_params \(100\) must be a multiple of group_size "
                                         r"\(64\)"):
        quantized_weight_bytes(100, 10, "int4", group_size=64)
    with pytest.raises(ValueError, match=r"num_params must be an integer >= 0"):
        quantized_weight_bytes(-1, 10, "int8")
