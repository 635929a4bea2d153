"""The kv_compression_config knob end to end through the configs: parsed on CacheConfig,
refused (field, value, what is allowed) before any work, the CLI flag, templates."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from workbench.config import CacheConfig, EngineConfig
from workbench.config.kv_compression import KVCompressionConfig
from workbench.engine.arg_utils import add_engine_args, engine_kwargs


def test_cache_config_parses_the_dict_and_keeps_a_config() -> None:
    cc = CacheConfig(block_size=4, kv_compression_config={"method": "streaming_llm",
                                                          "budget_tokens": 64})
    assert cc.kv_compression_config == KVCompressionConfig(method="streaming_llm",
                                                           budget_tokens=64)
    assert CacheConfig().kv_compression_config is None
    given = KVCompressionConfig(method="streaming_llm", budget_ratio=0.5)
    assert CacheConfig(kv_compression_config=given).kv_compression_config is given


@pytest.mark.parametrize(("value", "message"), [
    ({"method": "lru", "budget_tokens": 8},
     r"kv_compression_config.method \('lru'\) must be one of 'streaming_llm', 'h2o', 'snapkv', "
     "'pyramidkv'"),
    ({"method": "streaming_llm"}, "kv_compression_config needs exactly one of budget_tokens"),
    ({"method": "streaming_llm", "budget_tokens": 0},
     r"kv_compression_config.budget_tokens \(0\) must be an integer >= 1"),
    ({"method": "streaming_llm", "budget_ratio": 1.5},
     r"kv_compression_config.budget_ratio \(1.5\) must be a number in \(0, 1\]"),
    ({"method": "streaming_llm", "budget_tokens": 8, "window_size": 4},
     "kv_compression_config.window_size does not apply to method 'streaming_llm'"),
    ({"method": "streaming_llm", "budget_tokens": 8, "budget": 4},
     "kv_compression_config has an unknown key 'budget'"),
    ("streaming_llm", r"kv_compression_config \('streaming_llm'\) must be a dict"),
    ({"method": "streaming_llm", "budget_tokens": 8, "sink_tokens": 8},
     r"kv_compression_config.budget_tokens \(8\) leaves no recent window: it rounds up to 2 "
     r"block\(s\) of block_size 4, and sink_tokens \(8\) take 2"),
    ({"method": "streaming_llm", "budget_tokens": 16, "sink_tokens": 4, "recent_tokens": 16},
     r"sink_tokens \+ recent_tokens \(4 \+ 16\) must be <= budget_tokens \(16\)"),
])
def test_cache_config_refusals(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheConfig(block_size=4, kv_compression_config=value)


KC = {"method": "streaming_llm", "budget_tokens": 64}


@pytest.mark.parametrize(("extra", "message"), [
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
     r"kv_compression_config \(method 'streaming_llm'\) with speculative_config \(ngram\) is "
     "not supported"),
    ({"kv_transfer_config": {"kv_connector": "OffloadingConnector",
                             "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20}}},
     r"kv_compression_config \(method 'streaming_llm'\) with kv_transfer_config "
     r"\(OffloadingConnector\) is not supported"),
    ({"tensor_parallel_size": 2},
     r"kv_compression_config \(method 'streaming_llm'\) with tensor_parallel_size \(2\) is not "
     "supported yet"),
    ({"kv_cache_dtype": "int4"},
     r"kv_compression_config \(method 'streaming_llm'\) with kv_cache_dtype \('int4'\) is not "
     "supported yet"),
])
def test_engine_config_refuses_what_cannot_run(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs("bundled", device="cpu", max_model_len=128,
                                 kv_compression_config=KC, **extra)


def test_engine_config_accepts_it_with_chunked_prefill_off_and_prefix_caching() -> None:
    cfg = EngineConfig.from_kwargs("bundled", device="cpu", max_model_len=128,
                                   enforce_eager=True, enable_chunked_prefill=False,
                                   kv_compression_config=KC)
    assert cfg.cache_config.kv_compression_config == KVCompressionConfig(**KC)  # type: ignore[arg-type]


def test_cli_flag_parses_json() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--kv-compression-config",
                              '{"method": "streaming_llm", "budget_tokens": 32}'])
    kwargs = engine_kwargs(args)
    assert kwargs == {"kv_compression_config": {"method": "streaming_llm",
                                                "budget_tokens": 32}}
    cfg = EngineConfig.from_kwargs("bundled", device="cpu", enforce_eager=True, **kwargs)
    assert cfg.cache_config.kv_compression_config == KVCompressionConfig(
        method="streaming_llm", budget_tokens=32)
