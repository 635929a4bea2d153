"""Scoring an engine's model through the public API: perplexity, greedy agreement, KL, top-1.

Everything goes through `LLM.generate`, so the figures are the engine's own (its prefill,
quantized linear layers and paged KV cache included):

- `score_text`: next-token log-likelihood of a token stream in non-overlapping windows of
  `context` inputs (every token after the first predicted once). Each window is a prompt of
  context + 1 tokens sent with `SamplingParams(prompt_logprobs=1)`: the actual tokens'
  logprobs give the perplexity, the top-1 ids the argmax per position (the window's last
  input row is scored because its target rides in the prompt).
- `continuation_logprobs`: teacher-forced [len(continuation), vocab] log-probabilities of
  each continuation token's position, from `prompt_logprobs=-1` over prompt + continuation.
- `generate_greedy` / `agreement`: greedy tokens (ignore_eos) and how far two runs agree.
- `kl_and_top1`: mean / max KL(ref || cand) and top-1 agreement of paired log-probabilities.

Requests with prompt logprobs read no prefix cache (every position's logits are computed),
and the engine batches, chunks and preempts them like any request; the LLM must be idle.
The quality gate (`workbench.experiments.quality`) judges these figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from workbench.engine.llm import LLM

DEFAULT_PPL_TOKENS = 4096
DEFAULT_CONTEXT = 512

# The golden prompt set: code openings (the demo model knows Python's standard library).
GOLDEN_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
    "# Read a file and count its lines\n",
    "if __name__ == '__main__':\n",
    "with open(path) as f:\n",
    "try:\n    import json\nexcept ImportError:\n",
)


def golden_prompts(model: str | Path, num_prompts: int | None = None) -> list[list[int]]:
    """GOLDEN_PROMPTS (cycled to `num_prompts`) tokenized with `model`'s tokenizer."""
    from workbench.config.named_models import resolve_model
    from workbench.models.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model(model))
    n = len(GOLDEN_PROMPTS) if num_prompts is None else num_prompts
    return [list(tok(GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)])["input_ids"]) for i in range(n)]


def held_out_ids(model: str | Path, num_tokens: int = DEFAULT_PPL_TOKENS) -> list[int]:
    """The first `num_tokens` + 1 tokens of the held-out stdlib split (the demo corpus's:
    every HOLDOUT_EVERY-th file of `workbench.testing.demo_pair.corpus_files()`), each file as
    "<s> ... </s>" with `model`'s tokenizer (what the demo's `token_stream` does, so for the
    demo model these are the first tokens `held_out_stream` gives); fewer if the split is
    shorter. Files are read only until there are enough tokens."""
    import sysconfig

    from workbench.config.named_models import resolve_model
    from workbench.models.tokenizer import load_tokenizer
    from workbench.testing.demo_pair import HOLDOUT_EVERY, corpus_files

    tok = load_tokenizer(resolve_model(model))
    eos = tok.eos_token_id
    root = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for name in corpus_files(root)[::HOLDOUT_EVERY]:
        text = (root / name).read_text(encoding="utf-8")
        ids.extend(tok(text, verbose=False)["input_ids"])
        if eos is not None:
            ids.append(int(eos))
        if len(ids) > num_tokens:
            break
    return ids[: num_tokens + 1]


# ----------------------------------------------------------------------------- greedy


def generate_greedy(llm: LLM, prompts: Sequence[Sequence[int]], max_tokens: int
                    ) -> list[list[int]]:
    """`max_tokens` greedy tokens per prompt (ignore_eos) through `llm.generate`."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def greedy_tokens(
    model: str, engine_kwargs: dict[str, Any], prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """`generate_greedy` on a fresh `LLM(model, **engine_kwargs)`."""
    from workbench import LLM

    return generate_greedy(LLM(model, **engine_kwargs), prompts, max_tokens)


def agreement(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    """Identical tokens at identical positions / all positions (the longer of each pair),
    the first divergence position per prompt (None = identical) and how many are identical."""
    same = total = 0
    first_divergence: list[int | None] = []
    for ref, cand in zip(reference, candidate, strict=True):
        n = max(len(ref), len(cand))
        total += n
        diverged = None
        for i in range(n):
            if i < len(ref) and i < len(cand) and ref[i] == cand[i]:
                same += 1
            elif diverged is None:
                diverged = i
        first_divergence.append(diverged)
    return {
        "token_agreement": same / total if total else 1.0,
        "first_divergence": first_divergence,
        "identical_sequences": sum(d is None for d in first_divergence),
    }


# ----------------------------------------------------------------------------- scoring


def _prompt_logprobs(llm: LLM, prompts: Sequence[Sequence[int]], k: int) -> list[Any]:
    """One `LogprobsTensors` per prompt (row i scores prompt token i + 1)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params)
    runs = []
    for i, o in enumerate(outs):
        if o.prompt_logprobs_tensors is None:
            raise RuntimeError(f"scoring prompt {i} failed in the engine: "
                               f"{o.outputs[0].error if o.outputs else 'no output'}")
        runs.append(o.prompt_logprobs_tensors)
    return runs


@dataclass
class TextScore:
    tokens: int  # predicted tokens
    nll: float  # summed nats
    argmax: torch.Tensor = field(repr=False)  # [tokens] the model's top-1 at each position

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else float("nan")


def score_text(llm: LLM, ids: Sequence[int], context: int = DEFAULT_CONTEXT) -> TextScore:
    """Next-token NLL of `ids` in non-overlapping windows of `context` inputs (each window's
    tokens predict the next; every token after the first is predicted once), through the
    engine. A window's prompt carries its last target too, so windows are capped at
    max_model_len - 1 inputs."""
    context = max(1, min(int(context), int(llm.config.model_config.max_model_len) - 1))
    stream = list(ids)
    n = len(stream) - 1
    windows = [stream[s:min(s + context, n) + 1] for s in range(0, n, context)]
    runs = _prompt_logprobs(llm, windows, 1) if windows else []
    nll = -sum(float(r.token_logprobs.double().sum()) for r in runs)
    tops = [r.logprob_token_ids[:, 1] for r in runs]
    argmax = torch.cat(tops) if tops else torch.empty(0, dtype=torch.long)
    return TextScore(max(n, 0), nll, argmax)


def continuation_logprobs(
    llm: LLM, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Teacher-forced log-probabilities [len(continuation), vocab] (float32) of the next
    token at each continuation position: prompt + continuation goes in with
    prompt_logprobs=-1 and the rows from the prompt's last token on are kept."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations, strict=True)]
    out: list[torch.Tensor] = []
    for p, c, run in zip(prompts, continuations, _prompt_logprobs(llm, seqs, -1), strict=True):
        first = len(p) - 1
        out.append(run.full_logprobs[first:first + len(c)])
    return out


def kl_and_top1(ref: Sequence[torch.Tensor], cand: Sequence[torch.Tensor]
                ) -> tuple[float, float, float]:
    """(mean KL(ref || cand), max KL, top-1 agreement) over every row of the paired
    log-probability tensors."""
    kls, agree, rows = [], 0, 0
    for r, c in zip(ref, cand, strict=True):
        if r.shape[0] == 0:
            continue
        kls.append((r.exp() * (r - c)).sum(-1).clamp_min(0.0))
        agree += int((r.argmax(-1) == c.argmax(-1)).sum())
        rows += r.shape[0]
    if not rows:
        return 0.0, 0.0, 1.0
    k = torch.cat(kls)
    return float(k.mean()), float(k.max()), agree / rows
