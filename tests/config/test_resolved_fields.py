"""After validation a resolved knob holds its resolved type: the annotations say so (no
Optional), the values agree, and the knob metadata keeps what a caller may pass."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from workbench.config import (
    CompilationConfig,
    CompilationMode,
    EngineConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)

# (config class, field) -> the resolved annotation: never None after __post_init__
RESOLVED: dict[tuple[type, str], Any] = {
    (ModelConfig, "max_model_len"): int,
    (SchedulerConfig, "max_num_batched_tokens"): int,
    (EngineConfig, "attention_backend"): str,
    (EngineConfig, "compilation_config"): CompilationConfig,
    (EngineConfig, "speculative_config"): SpeculativeConfig | None,
    (EngineConfig, "kv_transfer_config"): KVTransferConfig | None,
}


def test_resolved_annotations_are_not_the_inputs() -> None:
    got = {key: typing.get_type_hints(key[0])[key[1]] for key in RESOLVED}
    assert got == RESOLVED
    inputs = {key: next(f for f in dataclasses.fields(key[0])
                        if f.name == key[1]).metadata["accepts"] for key in RESOLVED}
    assert inputs == {
        (ModelConfig, "max_model_len"): int | None,
        (SchedulerConfig, "max_num_batched_tokens"): int | None,
        (EngineConfig, "attention_backend"): str | None,
        (EngineConfig, "compilation_config"):
            CompilationConfig | dict[str, Any] | int | str | None,
        (EngineConfig, "speculative_config"): SpeculativeConfig | dict[str, Any] | None,
        (EngineConfig, "kv_transfer_config"): KVTransferConfig | dict[str, Any] | None,
    }


def test_scheduler_budget_resolves() -> None:
    assert SchedulerConfig(max_num_seqs=4).max_num_batched_tokens == 8192
    assert SchedulerConfig(max_num_seqs=9000).max_num_batched_tokens == 9000
    off = SchedulerConfig(enable_chunked_prefill=False, max_model_len=10000)
    assert off.max_num_batched_tokens == 10000
    assert SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4).max_num_batched_tokens == 64


def test_engine_config_inputs_resolve() -> None:
    cfg = EngineConfig.from_kwargs(
        "bundled", device="cpu", max_model_len=128, compilation_config={"mode": 0},
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        kv_transfer_config={"kv_connector": "OffloadingConnector",
                            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20}})
    assert cfg.model_config.max_model_len == 128
    assert cfg.scheduler_config.max_model_len == 128
    assert cfg.attention_backend == "torch"
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.speculative_config == SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=5, prompt_lookup_max=5)
    assert cfg.kv_transfer_config == KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_connector_extra_config={"cpu_bytes_to_use": 1 << 20})
    plain = EngineConfig.from_kwargs("bundled", device="cpu", enforce_eager=True)
    assert (plain.speculative_config, plain.kv_transfer_config) == (None, None)
    assert plain.model_config.max_model_len == 2048  # the model's max_position_embeddings
    assert plain.compilation_config.mode == CompilationMode.NONE
