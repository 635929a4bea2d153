"""The trained demo pair (workbench/assets/demo-target, demo-draft): the committed folders load
with transformers and our tokenizer loader, share one tokenizer byte for byte, fit the size
budget, carry their build_info, score sanely on the held-out stdlib files, and the build is
reproducible (checked in miniature: same seed -> byte-identical safetensors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from workbench.models.tokenizer import load_tokenizer
from workbench.testing.demo_pair import (
    BUILD_INFO,
    DEMO_DRAFT_DIR,
    DEMO_TARGET_DIR,
    build_pair,
    held_out_perplexity,
    stdlib_corpus,
)

PAIR = (DEMO_TARGET_DIR, DEMO_DRAFT_DIR)
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", BUILD_INFO)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SIZE_BUDGET = 25 * 10**6  # bytes, both folders together


def _info(folder: Path) -> dict[str, Any]:
    return json.loads((folder / BUILD_INFO).read_text())


@pytest.fixture(scope="module")
def models() -> tuple[PreTrainedModel, PreTrainedModel]:
    target, draft = (
        AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in PAIR
    )
    return target, draft


def test_folders_hold_weights_config_tokenizer_and_build_info() -> None:
    for folder in PAIR:
        for name in MODEL_FILES + TOKENIZER_FILES:
            assert (folder / name).is_file(), folder / name


def test_both_folders_fit_the_size_budget() -> None:
    total = sum(f.stat().st_size for d in PAIR for f in d.iterdir() if f.is_file())
    assert total <= SIZE_BUDGET, f"{total / 1e6:.1f} MB > {SIZE_BUDGET / 1e6:.0f} MB"


def test_tokenizer_files_are_byte_identical() -> None:
    for name in TOKENIZER_FILES:
        assert (DEMO_TARGET_DIR / name).read_bytes() == (DEMO_DRAFT_DIR / name).read_bytes(), name


def test_models_load_as_llama_with_one_vocab(
    models: tuple[PreTrainedModel, PreTrainedModel],
) -> None:
    target, draft = models
    for model, folder in zip(models, PAIR, strict=True):
        assert type(model).__name__ == "LlamaForCausalLM"
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 1)
        assert cfg["dtype"] == "float16"
    assert target.config.vocab_size == draft.config.vocab_size
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    assert n_target >= 4 * n_draft
    assert (n_target, n_draft) == tuple(_info(d)["model"]["params"] for d in PAIR)


def test_tokenizer_loads_and_round_trips() -> None:
    tokenizers = [load_tokenizer(d) for d in PAIR]
    assert tokenizers[0].get_vocab() == tokenizers[1].get_vocab()
    tok = tokenizers[0]
    vocab_size = json.loads((DEMO_TARGET_DIR / "config.json").read_text())["vocab_size"]
    assert len(tok) == vocab_size
    assert (tok.bos_token_id, tok.eos_token_id) == (0, 1)
    text = "import os\n\ndef main() -> None:\n    print(os.getcwd())\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == 0 and len(ids) < len(text) / 2  # BPE trained on Python compresses it
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_build_info_records_the_build_and_scores() -> None:
    target, draft = (_info(d) for d in PAIR)
    for info in (target, draft):
        for key in ("seed", "python_version", "corpus", "training", "held_out_perplexity",
                    "top1_agreement", "build_wall_time_s", "greedy_samples"):  # fmt: skip
            assert key in info, key
        assert info["training"]["steps"] > 0 and info["training"]["wall_time_s"] > 0
        assert info["corpus"]["held_out_file_list"]
    assert target["pair"] == draft["pair"]
    pair = target["pair"]
    assert pair["target_perplexity"] == target["held_out_perplexity"]
    assert pair["draft_perplexity"] == draft["held_out_perplexity"]
    assert target["held_out_perplexity"] < draft["held_out_perplexity"]
    assert target["held_out_perplexity"] < 0.5 * pair["uniform_perplexity"]
    assert 0.0 < pair["top1_agreement"] < 1.0
    assert target["build_wall_time_s"] <= 30 * 60


def test_held_out_perplexity_is_sane_and_target_beats_draft() -> None:
    vocab_size = json.loads((DEMO_TARGET_DIR / "config.json").read_text())["vocab_size"]
    target = held_out_perplexity(DEMO_TARGET_DIR, max_tokens=2048)
    draft = held_out_perplexity(DEMO_DRAFT_DIR, max_tokens=2048)
    assert 1.0 < target < 0.5 * vocab_size
    assert target < draft


def test_held_out_files_are_not_trained_on() -> None:
    corpus = stdlib_corpus()
    assert not set(corpus.train_files) & set(corpus.held_out_files)
    assert len(corpus.held_out_files) >= 10
    if _info(DEMO_TARGET_DIR)["python_version"] == corpus.describe()["python_version"]:
        assert _info(DEMO_TARGET_DIR)["corpus"]["sha256"] == corpus.sha256()


_TINY_TARGET = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
_TINY_DRAFT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8)  # fmt: skip


def _tiny_build(out: Path, seed: int) -> dict[str, Any]:
    return build_pair(
        out, seed, _TINY_TARGET, _TINY_DRAFT, steps=3, draft_steps=2,
        vocab_size=320, batch_size=2, context=32, corpus=stdlib_corpus(max_files=21),
        eval_max_tokens=128, samples=("def ",), log=lambda _: None,
    )  # fmt: skip


def test_build_is_reproducible_in_miniature(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    a = _tiny_build(tmp_path / "a", seed=0)
    b = _tiny_build(tmp_path / "b", seed=0)
    c = _tiny_build(tmp_path / "c", seed=1)
    assert torch.get_num_threads() == threads  # the build restores the thread count
    assert a["target_perplexity"] == b["target_perplexity"]
    for name in ("demo-target", "demo-draft"):
        for file in ("model.safetensors", "config.json") + TOKENIZER_FILES:
            assert (tmp_path / "a" / name / file).read_bytes() == (
                tmp_path / "b" / name / file
            ).read_bytes(), (name, file)
        weights = (tmp_path / "a" / name / "model.safetensors").read_bytes()
        assert weights != (tmp_path / "c" / name / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "demo-target" / "tokenizer.json").read_bytes() == (
        tmp_path / "a" / "demo-draft" / "tokenizer.json"
    ).read_bytes()
    info = _info(tmp_path / "a" / "demo-target")
    assert info["training"]["steps"] == 3 and info["seed"] == 0
    assert c["target_perplexity"] != a["target_perplexity"]
