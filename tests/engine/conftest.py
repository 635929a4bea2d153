"""Shared fixtures: tiny checkpoints per architecture and transformers' greedy reference."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from workbench.testing import tiny_checkpoint

NUM_OUTPUT = 12
ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {arch: tiny_checkpoint(root / arch, arch=arch, seed=0) for arch in ARCHS}


def mixed_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """10 prompts of mixed lengths (3..70); the last four share a 37-token prefix."""
    rng = random.Random(seed)
    lo = 10  # keep clear of special tokens
    prompts = [[rng.randrange(lo, vocab_size) for _ in range(n)] for n in (3, 70, 17, 33, 9, 52)]
    shared = [rng.randrange(lo, vocab_size) for _ in range(37)]
    for n in (4, 11, 1, 26):
        prompts.append(shared + [rng.randrange(lo, vocab_size) for _ in range(n)])
    return prompts


def hf_greedy(path: Path, prompts: list[list[int]], num_output: int) -> list[list[int]]:
    """transformers `generate`, greedy, one prompt at a time, EOS never stops it."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = GenerationConfig(
        max_new_tokens=num_output, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config
            )
            out = gen[0, len(p):].tolist()
            assert len(out) == num_output, "transformers stopped early: EOS was not disabled"
            outs.append(out)
    return outs


@pytest.fixture(scope="session")
def references(checkpoints: dict[str, Path]) -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    import json

    refs = {}
    for arch, path in checkpoints.items():
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        prompts = mixed_prompts(vocab)
        refs[arch] = (prompts, hf_greedy(path, prompts, NUM_OUTPUT))
    return refs
