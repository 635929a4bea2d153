"""tiny_checkpoint: deterministic files, seed-dependent weights, working tokenizer, overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from workbench.testing import tiny_checkpoint
from workbench.testing.checkpoint import DEFAULT_VOCAB_SIZE, default_initializer_range

FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json",
         "generation_config.json")  # fmt: skip


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_same_seed_same_bytes_different_seed_different_weights(tmp_path: Path) -> None:
    a = tiny_checkpoint(tmp_path / "a", "qwen3", seed=3)
    b = tiny_checkpoint(tmp_path / "b", "qwen3", seed=3)
    c = tiny_checkpoint(tmp_path / "c", "qwen3", seed=4)
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    wa, wc = load_file(a / "model.safetensors"), load_file(c / "model.safetensors")
    assert wa.keys() == wc.keys()
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert not torch.equal(
        wa["model.layers.0.self_attn.q_norm.weight"], wc["model.layers.0.self_attn.q_norm.weight"]
    )
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_defaults_and_init(tmp_path: Path) -> None:
    folder = tiny_checkpoint(tmp_path / "q", "qwen2")
    cfg = _config(folder)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    expected = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    vocab_size=DEFAULT_VOCAB_SIZE, max_position_embeddings=2048,
                    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                    initializer_range=0.2)  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    gen = json.loads((folder / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (0, 1)
    w = load_file(folder / "model.safetensors")
    assert abs(w["model.embed_tokens.weight"].std().item() - 0.2) < 0.01
    assert default_initializer_range(512) == 0.0707
    assert not torch.equal(w["model.norm.weight"], torch.ones(64))  # perturbed, not HF's ones
    assert w["model.layers.0.self_attn.q_proj.bias"].abs().sum() > 0  # qwen2 bias non-zero
    assert _config(tiny_checkpoint(tmp_path / "q3", "qwen3"))["head_dim"] == 16
    assert _config(tiny_checkpoint(tmp_path / "m", "mistral"))["sliding_window"] is None


def test_tokenizer_round_trip(tmp_path: Path) -> None:
    folder = tiny_checkpoint(tmp_path / "t", "llama")
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == DEFAULT_VOCAB_SIZE
    assert (tok.bos_token, tok.bos_token_id) == ("<s>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("</s>", 1)
    text = "import os\n\ndef main(argv):  # héllo wörld ✓ 🚀\n\treturn 0\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == 0 and len(ids) < len(text.encode())  # bos + merges compress
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert max(ids) < DEFAULT_VOCAB_SIZE


def test_overrides(tmp_path: Path) -> None:
    rope = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    folder = tiny_checkpoint(
        tmp_path / "big", "llama", seed=1, hidden_size=96, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=3, vocab_size=512,
        tie_word_embeddings=True, rope_scaling=rope, initializer_range=0.05,
    )  # fmt: skip
    cfg = _config(folder)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (96, 3, 512)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (6, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["initializer_range"] == 0.05
    assert cfg["rope_parameters"] == {**rope, "rope_theta": 10000.0}
    w = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in w and w["model.embed_tokens.weight"].shape == (512, 96)
    assert len(AutoTokenizer.from_pretrained(folder)) == 512


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch \\('gpt2'\\) must be one of llama, qwen2"):
        tiny_checkpoint(tmp_path / "x", "gpt2")
    with pytest.raises(ValueError, match="vocab_size \\(100\\) must be >= 258"):
        tiny_checkpoint(tmp_path / "y", "llama", vocab_size=100)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_vocab_beyond_learned_merges_is_padded(tmp_path: Path) -> None:
    folder = tiny_checkpoint(
        tmp_path / "v",
        "mistral",
        vocab_size=16384,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
    )
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == 16384 == _config(folder)["vocab_size"]
    assert tok.convert_ids_to_tokens(16383).startswith("<extra_")
    assert tok.decode(tok("hello world")["input_ids"], skip_special_tokens=True) == "hello world"
