"""The offline benchmark's inputs: a fixed, seeded request list and the bench checkpoint.

Owned here: `make_offline_workload` (64 requests, prompt lengths uniform in [32, 256], output
lengths uniform in [16, 128], token ids given directly), its sha256 `checksum`, and
`build_bench_checkpoint` (the ~30M-parameter Llama shape every engine loads, or another
preset of `BENCH_MODELS`: "small", a demo-sized Llama on a shorter workload). Nothing here
imports torch, so the workload can be built and checked anywhere.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NUM_REQUESTS = 64
PROMPT_LEN_RANGE = (32, 256)
OUTPUT_LEN_RANGE = (16, 128)
# Token ids are drawn from [low, high): ids below `low` are left to special tokens.
DEFAULT_TOKEN_RANGE = (16, 8192)

# The bench model: a ~30M-parameter Llama shape (27.8M in matmuls + 4.2M embedding), untied.
BENCH_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 1408,
    "vocab_size": 8192,
    "tie_word_embeddings": False,
    "max_position_embeddings": 512,  # >= 256 + 128, the longest request
}
# The small model of the step-overhead issue: a demo-sized Llama (~3.6M parameters), where
# the engine's fixed per-step cost shows; its workload is shorter (see BENCH_MODELS).
SMALL_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "intermediate_size": 768,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,  # >= 128 + 64: the longest request and the single probe
}
_MARKER = ".bench_checkpoint.json"


@dataclass(frozen=True)
class BenchModel:
    """A bench preset: the checkpoint's shape, its folder name under .bench/offline/ and the
    workload it is measured on (`--model` of `workbench bench offline`)."""

    config: dict[str, Any]
    folder: str
    num_requests: int
    prompt_len_range: tuple[int, int]
    output_len_range: tuple[int, int]


BENCH_MODELS: dict[str, BenchModel] = {
    "bench": BenchModel(BENCH_MODEL_CONFIG, "llama-30m", NUM_REQUESTS, PROMPT_LEN_RANGE,
                        OUTPUT_LEN_RANGE),
    "small": BenchModel(SMALL_MODEL_CONFIG, "llama-small", 48, (16, 128), (8, 64)),
}


@dataclass(frozen=True)
class OfflineRequest:
    """One request: the prompt as token ids and how many tokens to generate (ignore_eos)."""

    prompt_token_ids: list[int]
    max_tokens: int


def make_offline_workload(
    seed: int = 0,
    *,
    num_requests: int = NUM_REQUESTS,
    prompt_len_range: tuple[int, int] = PROMPT_LEN_RANGE,
    output_len_range: tuple[int, int] = OUTPUT_LEN_RANGE,
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE,
) -> list[OfflineRequest]:
    """The fixed request list: the same arguments always give the same requests.

    Ranges are inclusive for lengths and half-open for token ids. `random.Random(seed)` is
    used (stable across Python versions for `randint`), so no numpy/torch seed is involved.
    """
    lo, hi = token_range
    if not 0 <= lo < hi:
        raise ValueError(f"token_range ({token_range}) must satisfy 0 <= low < high")
    for name, (a, b) in (("prompt_len_range", prompt_len_range),
                         ("output_len_range", output_len_range)):
        if not 1 <= a <= b:
            raise ValueError(f"{name} ({(a, b)}) must satisfy 1 <= min <= max")
    if num_requests < 1:
        raise ValueError(f"num_requests ({num_requests}) must be >= 1")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = rng.randint(*prompt_len_range)
        max_tokens = rng.randint(*output_len_range)
        ids = [rng.randrange(lo, hi) for _ in range(prompt_len)]
        requests.append(OfflineRequest(prompt_token_ids=ids, max_tokens=max_tokens))
    return requests


def single_request(
    seed: int = 1, prompt_len: int = 128, max_tokens: int = 64,
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE,
) -> OfflineRequest:
    """The single-request latency probe (prompt 128, 64 output tokens by default)."""
    rng = random.Random(seed)
    ids = [rng.randrange(*token_range) for _ in range(prompt_len)]
    return OfflineRequest(prompt_token_ids=ids, max_tokens=max_tokens)


def to_json(requests: list[OfflineRequest]) -> list[dict[str, Any]]:
    """The canonical form: what the checksum hashes and what the vLLM worker reads."""
    return [{"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
            for r in requests]


def checksum(requests: list[OfflineRequest]) -> str:
    """sha256 of the canonical JSON of the request list (order, ids and lengths)."""
    blob = json.dumps(to_json(requests), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def workload_tokens(requests: list[OfflineRequest]) -> tuple[int, int]:
    """(prompt tokens, output tokens) of the workload."""
    return (sum(len(r.prompt_token_ids) for r in requests), sum(r.max_tokens for r in requests))


def non_special_token_range(ckpt_dir: str | Path) -> tuple[int, int]:
    """[low, high) of ordinary token ids in a checkpoint: at least DEFAULT_TOKEN_RANGE[0],
    above the special (added) tokens at the start of the vocabulary, below those at its end
    (e.g. "<extra_i>" fillers) and below both the model's and the tokenizer's size."""
    ckpt = Path(ckpt_dir)
    vocab = int(json.loads((ckpt / "config.json").read_text())["vocab_size"])
    low = DEFAULT_TOKEN_RANGE[0]
    tok_path = ckpt / "tokenizer.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        added = sorted(int(t["id"]) for t in tok.get("added_tokens", []))
        tok_vocab = tok.get("model", {}).get("vocab") or {}
        vocab = min(vocab, max([*tok_vocab.values(), *added], default=vocab - 1) + 1)
        low = max([low, *(a + 1 for a in added if a < vocab // 2)])
        vocab = min([vocab, *(a for a in added if a >= low)])
    if low >= vocab:
        raise ValueError(f"checkpoint {ckpt} has no ordinary token ids in [{low}, {vocab})")
    return (low, vocab)


def build_bench_checkpoint(ckpt_dir: str | Path, seed: int = 0,
                           config: dict[str, Any] | None = None) -> Path:
    """Build (once) the bench checkpoint in `ckpt_dir` with `workbench.testing.tiny_checkpoint`.

    Idempotent: a marker file records the config and a hash of the builder's source; a
    folder whose marker matches is reused, anything else is rebuilt.
    """
    import inspect

    from workbench.testing import checkpoint as builder

    ckpt = Path(ckpt_dir)
    source = hashlib.sha256(inspect.getsource(builder).encode()).hexdigest()[:16]
    config = BENCH_MODEL_CONFIG if config is None else config
    want = {"arch": "llama", "seed": seed, "builder_sha256": source, **config}
    marker = ckpt / _MARKER
    if marker.is_file() and (ckpt / "config.json").is_file():
        try:
            if json.loads(marker.read_text()) == want:
                return ckpt
        except json.JSONDecodeError:
            pass
    path = Path(builder.tiny_checkpoint(ckpt, arch="llama", seed=seed, **config))
    (path / _MARKER).write_text(json.dumps(want, indent=1, sort_keys=True))
    return path
