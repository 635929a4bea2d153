"""The needle model: the demo target fine-tuned to retrieve a passkey from a haystack.

    make needle-model
    python -m workbench.testing.needle_model build [--seed 0] [--out DIR] [--threads N]
    python -m workbench.testing.needle_model eval [--dir DIR]

Eviction policies and low-bit KV need a quality gate that fails when the KV that matters is
gone; greedy agreement on short code prompts cannot see that, a passkey task can. The demo
target (`workbench.testing.demo_pair`, trained on Python's stdlib) does not look things up
far back on its own, so `build` fine-tunes it, seeded, in float32 on CPU:

- data: rows of passkey cases (`workbench.testing.needle_cases`, the TRAINING split's code as
  haystack, depth uniform in [0, 1], random 5-digit passkeys) followed by the answer line
  (" 48213\\n"), and (LM_FRACTION of the rows) plain windows of the training token stream,
  the demo's own pre-training data, so perplexity stays where it was;
- loss: mean next-token cross-entropy over every haystack / window token + ANSWER_WEIGHT x the
  mean over the answer's tokens (the only tokens that need retrieval);
- length curriculum: STAGES of (shortest, longest prompt, steps); each step draws one length
  and fills TOKENS_PER_STEP tokens with rows of it; one AdamW schedule (linear warmup, cosine
  decay) over all steps;
- RoPE: max_position_embeddings raised from 1024 to MAX_POSITIONS and Llama 3.1's
  frequency-dependent interpolation (ROPE_PARAMETERS, factor 2 over the demo's 512-token
  training context) so 1024-token prompts look like the distances the demo learned; no new
  weights. The longest prompts (1024) are trained together with their answers.

The weights are saved as float16 safetensors with the demo's tokenizer (same bytes, its
model_max_length raised) into workbench/assets/demo-needle; build_info.json holds the recipe,
the seed, the held-out perplexity (before / after) and the needle accuracy on the default grid
(held-out haystack, never trained on), measured on the saved weights. One thread per build by
default: on a shared 2-core machine the step time is steadier, and the bytes depend on the
thread count.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from workbench.testing import needle_cases as nc
from workbench.testing.checkpoint import EOS_TOKEN_ID, save_tokenizer
from workbench.testing.demo_pair import (
    ASSETS_DIR,
    DEMO_TARGET_DIR,
    _lr_at,
    _threads,
    _version,
    held_out_stream,
    load_model,
    load_tokenizer_fast,
    save_model,
    score,
    stdlib_corpus,
    token_stream,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NEEDLE_NAME = "demo-needle"
DEMO_NEEDLE_DIR = ASSETS_DIR / NEEDLE_NAME
MAX_POSITIONS = 1280
# Llama 3.1's frequency-dependent RoPE interpolation from the demo's 512-token training
# context: wavelengths over 512 slowed 2x, under 128 kept, smoothed between (transformers
# and workbench/layers/rotary.py compute it the same way). Without it the model retrieved
# perfectly up to 512 tokens and at chance near 1024 after the same curriculum.
ROPE_PARAMETERS: dict[str, Any] = {
    "rope_type": "llama3", "rope_theta": 10000.0, "factor": 2.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 512,
}
SEED = 0
STAGES: tuple[tuple[int, int, int], ...] = (  # (shortest, longest prompt, steps)
    (64, 128, 300),
    (64, 256, 80),
    (128, 512, 60),
    (256, 1024, 160),
)
TOKENS_PER_STEP = 2048
LM_FRACTION = 0.15
ANSWER_WEIGHT = 3.0
PEAK_LR = 1.5e-3
WARMUP_STEPS = 20
WEIGHT_DECAY = 0.1
NUM_THREADS = 1
PPL_TOKENS = 32768
PROBE_CASES = 8  # held-out cases at each stage's longest length, logged after the stage


def _print(msg: str) -> None:
    print(msg, flush=True)


def _needle_row(hay: nc.Haystack, length: int, rng: random.Random) -> tuple[list[int], int]:
    """(prompt + answer line ids, index of the first answer token)."""
    case = nc.make_case(hay, length, rng.random(), rng)
    answer = hay.tokenizer.encode(" " + case.answer, add_special_tokens=False).ids
    return list(case.prompt_token_ids) + list(answer) + [hay.newline_id], len(
        case.prompt_token_ids)


def make_batch(hay: nc.Haystack, stream: torch.Tensor, length: int, rows: int,
               rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids [rows, T], targets [rows, T], answer mask [rows, T]; target -100 =
    ignored), T = length + the longest answer line - 1 (`length` without needle rows);
    needle rows are right-padded with </s>, their padding ignored."""
    seqs: list[tuple[list[int], int]] = []
    for _ in range(rows):
        if rng.random() < LM_FRACTION:
            seqs.append(([], -1))
        else:
            seqs.append(_needle_row(hay, length, rng))
    width = max([len(s) - 1 for s, _ in seqs if s] or [length])
    x = torch.full((rows, width), EOS_TOKEN_ID, dtype=torch.long)
    y = torch.full((rows, width), -100, dtype=torch.long)
    ans = torch.zeros((rows, width), dtype=torch.bool)
    for r, (seq, first) in enumerate(seqs):
        if not seq:  # a plain window of the training stream
            start = rng.randrange(len(stream) - width - 1)
            window = stream[start:start + width + 1]
            x[r], y[r] = window[:-1], window[1:]
            continue
        t = torch.tensor(seq)
        n = len(seq) - 1
        x[r, :n], y[r, :n] = t[:-1], t[1:]
        ans[r, first - 1:n] = True  # targets from the first answer token on
    return x, y, ans


def needle_loss(logits: torch.Tensor, y: torch.Tensor, ans: torch.Tensor
                ) -> tuple[torch.Tensor, float, float, float]:
    """(loss, LM part, answer part, answer tokens' top-1 accuracy): the loss is the two
    means, the answer's x ANSWER_WEIGHT."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                         ignore_index=-100, reduction="none").view_as(y)
    valid = y != -100
    lm_mask, ans_mask = valid & ~ans, valid & ans
    lm = (ce * lm_mask).sum() / lm_mask.sum().clamp_min(1)
    an = (ce * ans_mask).sum() / ans_mask.sum().clamp_min(1)
    hit = (logits.detach().argmax(-1) == y)[ans_mask].float().mean()
    return lm + ANSWER_WEIGHT * an, float(lm.detach()), float(an.detach()), float(hit)


@torch.no_grad()
def needle_accuracy(model: torch.nn.Module, cases: Sequence[nc.NeedleCase],
                    tokenizer: Any) -> list[bool]:
    """Greedy answers (KV-cached, a batch per length) scored by exact passkey match."""
    out: dict[str, bool] = {}
    by_len: dict[int, list[nc.NeedleCase]] = {}
    for c in cases:
        by_len.setdefault(c.context_tokens, []).append(c)
    for group in by_len.values():
        ids = torch.tensor([list(c.prompt_token_ids) for c in group])
        steps = max(c.max_tokens for c in group)
        res = model(input_ids=ids, use_cache=True)
        gen = []
        for _ in range(steps):
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
            gen.append(nxt)
            res = model(input_ids=nxt, cache=res.cache, use_cache=True)
        tokens = torch.cat(gen, 1)
        for c, row in zip(group, tokens.tolist(), strict=True):
            text = tokenizer.decode(row[:c.max_tokens], skip_special_tokens=True)
            out[c.case_id] = nc.passkey_correct(text, c.answer)
    return [out[c.case_id] for c in cases]


def grid_table(cases: Sequence[nc.NeedleCase], correct: Sequence[bool]) -> dict[str, Any]:
    """{"accuracy": overall, "cells": {"len/depth": accuracy}, "cases": n}."""
    cells: dict[str, list[bool]] = {}
    for c, ok in zip(cases, correct, strict=True):
        cells.setdefault(f"{c.context_tokens}/{c.depth:g}", []).append(ok)
    return {"accuracy": round(sum(correct) / len(correct), 4), "cases": len(correct),
            "cells": {k: round(sum(v) / len(v), 4) for k, v in cells.items()}}


def _load_for_training(folder: Path) -> PreTrainedModel:
    """The base folder in float32 with MAX_POSITIONS and ROPE_PARAMETERS."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(ROPE_PARAMETERS), local_files_only=True).eval()


def train(model: PreTrainedModel, hay: nc.Haystack, stream: torch.Tensor, probe: nc.Haystack,
          seed: int, log: Any = _print) -> dict[str, Any]:
    """Fine-tune `model` in place through STAGES; returns the training stats."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    total = sum(s for _, _, s in STAGES)
    step, tokens, t0 = 0, 0, time.perf_counter()
    probes: list[dict[str, Any]] = []
    for lo, hi, steps in STAGES:
        for _ in range(steps):
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, total, PEAK_LR, WARMUP_STEPS)
            length = rng.randint(lo, hi)
            x, y, ans = make_batch(hay, stream, length, max(1, TOKENS_PER_STEP // length), rng)
            loss, lm, an, hit = needle_loss(model(input_ids=x).logits, y, ans)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            tokens += x.numel()
            if step % 10 == 0 or step == total:
                el = time.perf_counter() - t0
                log(f"[needle] step {step}/{total} len {length} lm {lm:.3f} answer {an:.3f} "
                    f"(top-1 {hit:.2f}) {tokens / el:.0f} tok/s elapsed {el:.0f}s")
        model.eval()
        cases = [nc.make_case(probe, hi, i / (PROBE_CASES - 1), random.Random(f"probe/{i}"))
                 for i in range(PROBE_CASES)]
        acc = sum(needle_accuracy(model, cases, probe.tokenizer)) / len(cases)
        probes.append({"after_step": step, "length": hi, "accuracy": acc})
        log(f"[needle] stage up to {hi} tokens done: probe accuracy {acc:.3f}")
        model.train()
    model.eval()
    wall = time.perf_counter() - t0
    return {"steps": total, "tokens_seen": tokens, "wall_time_s": round(wall, 1),
            "tokens_per_s": round(tokens / wall, 1), "stage_probes": probes,
            "threads": torch.get_num_threads()}


def recipe() -> dict[str, Any]:
    return {
        "base_model": "demo-target (workbench.testing.demo_pair)",
        "task": {"needle_line": nc.NEEDLE_LINE.strip(), "question": nc.QUESTION,
                 "passkey_digits": nc.PASSKEY_DIGITS, "answer_target": "' <passkey>\\n'",
                 "haystack": "training split's top-level code blocks (needle_cases)",
                 "depth": "uniform in [0, 1]"},
        "stages": [{"min_len": lo, "max_len": hi, "steps": s} for lo, hi, s in STAGES],
        "tokens_per_step": TOKENS_PER_STEP, "lm_fraction": LM_FRACTION,
        "answer_weight": ANSWER_WEIGHT,
        "optimizer": f"AdamW(betas=(0.9, 0.95), eps=1e-8, weight_decay={WEIGHT_DECAY}, no "
                     "decay on norms), grad-norm clip 1.0",
        "schedule": f"linear warmup {WARMUP_STEPS} steps, cosine decay to 10% of {PEAK_LR}",
        "precision": "float32", "max_position_embeddings": MAX_POSITIONS,
        "rope_parameters": ROPE_PARAMETERS,
    }


def evaluate(folder: Path, log: Any = _print) -> dict[str, Any]:
    """Needle accuracy on the default grid and held-out perplexity of a saved folder."""
    model = load_model(folder)
    tok = load_tokenizer_fast(folder)
    cases = nc.make_grid(nc.Haystack.from_stdlib(tok, "held_out"))
    t = time.perf_counter()
    table = grid_table(cases, needle_accuracy(model, cases, tok))
    log(f"needle grid: accuracy {table['accuracy']} on {table['cases']} cases "
        f"({time.perf_counter() - t:.0f}s)")
    ppl = score([model], held_out_stream(folder), 512, PPL_TOKENS).perplexity(0)
    return {"needle_grid": {"lengths": list(nc.DEFAULT_LENGTHS),
                            "depths": list(nc.DEFAULT_DEPTHS),
                            "cases_per_cell": nc.DEFAULT_CASES_PER_CELL,
                            "seed": nc.DEFAULT_SEED, **table},
            "held_out_perplexity": round(ppl, 4), "perplexity_tokens": PPL_TOKENS}


def build(out: Path = DEMO_NEEDLE_DIR, seed: int = SEED, source: Path = DEMO_TARGET_DIR,
          threads: int = NUM_THREADS, log: Any = _print) -> dict[str, Any]:
    """Fine-tune `source` into `out` (module docstring); returns build_info."""
    t_start = time.perf_counter()
    with _threads(threads):
        tok = load_tokenizer_fast(source)
        hay = nc.Haystack.from_stdlib(tok, "train")
        probe = nc.Haystack.from_stdlib(tok, "held_out")
        stream = token_stream(tok, stdlib_corpus().train_texts)
        log(f"haystack: {len(hay.chunks)} training chunks; LM stream {len(stream)} tokens")
        base = load_model(source)
        base_ppl = score([base], held_out_stream(source), 512, PPL_TOKENS).perplexity(0)
        model = _load_for_training(source)
        stats = train(model, hay, stream, probe, seed, log)
        save_model(model, out)
        save_tokenizer(out, (source / "tokenizer.json").read_text(), MAX_POSITIONS)
        scores = evaluate(out, log)
    info = {
        "name": out.name, "role": "needle",
        "command": f"python -m workbench.testing.needle_model build --seed {seed} "
                   f"--threads {threads}",
        "seed": seed, "recipe": recipe(), "training": stats,
        "needle_accuracy": scores["needle_grid"]["accuracy"], **scores,
        "base_held_out_perplexity": round(base_ppl, 4),
        "cpu": platform.processor() or platform.machine(),
        "python_version": platform.python_version(), "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "tokenizers_version": _version("tokenizers"),
        "safetensors_bytes": (out / "model.safetensors").stat().st_size,
        "build_wall_time_s": round(time.perf_counter() - t_start, 1),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"build done in {info['build_wall_time_s']:.0f}s -> {out}: needle accuracy "
        f"{info['needle_accuracy']}, held-out perplexity {info['held_out_perplexity']} "
        f"(base {info['base_held_out_perplexity']})")
    return info


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.testing.needle_model",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fine-tune demo-target into demo-needle")
    b.add_argument("--seed", type=int, default=SEED)
    b.add_argument("--out", type=Path, default=DEMO_NEEDLE_DIR)
    b.add_argument("--threads", type=int, default=NUM_THREADS)
    e = sub.add_parser("eval", help="needle grid accuracy and perplexity of a folder")
    e.add_argument("--dir", type=Path, default=DEMO_NEEDLE_DIR)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.out, args.seed, threads=args.threads)
    else:
        with _threads(NUM_THREADS):
            print(json.dumps(evaluate(args.dir), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
