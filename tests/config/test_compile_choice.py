"""The measured compiled-or-eager default (workbench.config.compile_choice): the record's keys and
threshold, and EngineConfig taking the mode from it only when nobody set one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.config import EngineConfig
from workbench.config import compile_choice as cc
from workbench.config.compilation import MODE_ENV, CompilationMode
from workbench.platforms.cpu_info import machine_fingerprint
from workbench.testing import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("choice") / "llama", arch="llama", seed=0)


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(MODE_ENV, raising=False)


def test_model_key_names_the_shape_and_dtype() -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
           "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
           "intermediate_size": 768, "vocab_size": 4096}
    assert cc.model_key(cfg, "float32") == (
        "LlamaForCausalLM; layers=4; hidden=256; heads=8; kv_heads=4; head_dim=32; "
        "intermediate=768; vocab=4096; dtype=float32")
    assert "kv_heads=8" in cc.model_key({**cfg, "num_key_value_heads": None}, "float32")


def test_record_lookup_and_the_threshold(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    assert cc.lookup("m", machine="A", path=path) is None
    cc.record("m", cc.CompileChoice(1000.0, 1040.0, "2026-12-02", "test"), "A", path)
    cc.record("m", cc.CompileChoice(1000.0, 1050.0, "2026-12-02", "test"), "B", path)
    a, b = cc.lookup("m", "A", path), cc.lookup("m", "B", path)
    assert a is not None and b is not None
    assert (a.ratio, a.compiles, b.compiles) == (1.04, False, True)  # needs >= 1.05x
    data = json.loads(path.read_text())
    assert data["machines"]["A"]["m"] == {"eager_tok_s": 1000.0, "compiled_tok_s": 1040.0,
                                          "date": "2026-12-02", "source": "test",
                                          "compiled_slowest_tok_s": None}
    assert cc.lookup("other model", "A", path) is None
    # a gain inside the runs' spread is no gain: the compiled side's slowest run must reach
    # the eager median
    spread = cc.CompileChoice(1000.0, 1060.0, "2026-12-02", "t", compiled_slowest_tok_s=940.0)
    steady = cc.CompileChoice(1000.0, 1060.0, "2026-12-02", "t", compiled_slowest_tok_s=1000.0)
    assert (spread.compiles, steady.compiles) == (False, True)
    cc.record("m", spread, "C", path)
    assert cc.lookup("m", "C", path) == spread
    path.write_text("{not json")
    assert cc.lookup("m", "A", path) is None  # unreadable: no record
    with pytest.raises(ValueError, match=r"compiled_tok_s \(0.0\) must be a number > 0"):
        cc.CompileChoice(1.0, 0.0, "", "")


def _record_for(ckpt: Path, eager: float, compiled: float) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cc.record(cc.model_key(cfg, "float32"), cc.CompileChoice(eager, compiled, "2026-12-02", "t"),
              machine_fingerprint())


def test_engine_default_follows_this_machines_record(ckpt: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EngineConfig.from_kwargs(str(ckpt), device="cpu", dtype="float32")
    assert cfg.compilation.mode == CompilationMode.NONE
    assert cfg.compilation_default is not None
    assert cfg.compilation_default.startswith("the CPU default: no measurement of this model")
    _record_for(ckpt, 1000.0, 1200.0)
    cfg = EngineConfig.from_kwargs(str(ckpt), device="cpu", dtype="float32")
    assert cfg.compilation.mode == CompilationMode.VLLM_COMPILE
    assert cfg.compilation_default == (
        "compiled, measured on this machine 2026-12-02: compiled/eager 1.20x (1200 vs 1000 "
        "output tok/s; compiled needs >= 1.05x and its slowest run at least the eager median)")
    # what the user or the environment says wins over the record
    assert EngineConfig.from_kwargs(str(ckpt), device="cpu", compilation_config=0,
                                    dtype="float32").compilation_default is None
    eager = EngineConfig.from_kwargs(str(ckpt), device="cpu", enforce_eager=True,
                                     dtype="float32")
    assert eager.compilation.mode == CompilationMode.NONE
    monkeypatch.setenv(MODE_ENV, "0")
    assert EngineConfig.from_kwargs(str(ckpt), device="cpu",
                                    dtype="float32").compilation.mode == CompilationMode.NONE
    monkeypatch.delenv(MODE_ENV)
    _record_for(ckpt, 1000.0, 930.0)
    cfg = EngineConfig.from_kwargs(str(ckpt), device="cpu", dtype="float32")
    assert cfg.compilation.mode == CompilationMode.NONE
    assert cfg.compilation_default is not None and cfg.compilation_default.startswith(
        "eager, measured on this machine 2026-12-02: compiled/eager 0.93x")
    # another dtype is another model key: no record
    bf16 = EngineConfig.from_kwargs(str(ckpt), device="cpu", dtype="bfloat16")
    assert bf16.compilation.mode == CompilationMode.NONE
    assert bf16.compilation_default is not None and "no measurement" in bf16.compilation_default
