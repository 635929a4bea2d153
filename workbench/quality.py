"""The quality gate: does a candidate engine config still say what the unquantized model says?

    ref  = reference("demo", {"dtype": "float32"})               # once per baseline
    rep  = evaluate("demo", {"dtype": "float32", "quantization": "int4"}, ref)
    ok, reasons = rep.passes({"min_token_agreement": 0.9, "max_ppl_increase_pct": 2.0,
                              "max_mean_kl": 0.02, "min_top1_agreement": 0.95})

Four figures, each measured through OUR engine's model (the quantized linear layers and the
paged KV cache included), the candidate against the reference config on the same model:

- **perplexity** on held-out text: the demo corpus's held-out split (every HOLDOUT_EVERY-th
  `.py` file of this Python's standard library, see `workbench.testing.demo_pair`), tokenized with
  the model's own tokenizer (each file as "<s> ... </s>"), first `ppl_tokens` + 1 tokens, cut
  into non-overlapping windows of `context` tokens; every token after the first is predicted
  once. For the trained demo model this text was never trained on; for other models it is
  just a fixed text that ships with Python. Same windows as `workbench.testing.demo_pair.score`.
- **greedy agreement** on a golden prompt set: both configs generate `max_tokens` greedy
  tokens (ignore_eos) through `LLM.generate`; identical tokens at identical positions / all
  tokens, and the first divergence position per prompt (None = identical).
- **mean KL(p_ref || p_cand)** and **top-1 agreement** of the next-token distributions at the
  positions of the reference's greedy continuations, teacher-forced: prompt + the
  reference's tokens go through both models, so a divergence does not change what is scored.
  Also the top-1 agreement over the held-out text positions (more positions, less noise).

How logits are obtained. The engine only computes logits for rows it samples, so the module
scores text with `score_sequences`: each sequence becomes a pretend request whose blocks are
allocated through the engine's own KV-cache manager (`allocate_slots`, freed afterwards; the
engine must be idle), the flat batch is built by `ModelRunner.build_batch` exactly as a
scheduler step would (positions from 0, slot mapping from the block table), and
`runner.model(...)` runs one prefill per sequence; `compute_logits` then runs on the rows
wanted. That is the engine's own prefill: quantized weights and the KV cache's storage
format are in it (the torch backend writes K/V into the pool and reads them back for
attention, prefills included), but sampling is not. Teacher-forced continuation positions are
scored by a prefill where generation scored them by decode steps: the same math over the
same cached K/V, in a different kernel (on CPU the decode path may be a C++ kernel whose
float sums differ in the last bits).

Thresholds (a template's `quality_gate` block, or a dict given to `passes`):
`min_token_agreement`, `max_ppl_increase_pct` (100 * (ppl_cand / ppl_ref - 1)),
`max_mean_kl` (nats), `min_top1_agreement`. Options in the same block: `num_prompts`,
`max_tokens`, `ppl_tokens`, `ppl_context`. A threshold whose figure was not measured fails.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from workbench.engine.llm import LLM

THRESHOLDS: dict[str, str] = {
    "min_token_agreement": "greedy token agreement",
    "max_ppl_increase_pct": "perplexity increase (%)",
    "max_mean_kl": "mean KL(ref || cand) (nats)",
    "min_top1_agreement": "top-1 agreement",
}
OPTIONS = ("num_prompts", "max_tokens", "ppl_tokens", "ppl_context")
GATE_KEYS = (*THRESHOLDS, *OPTIONS)

DEFAULT_MAX_TOKENS = 32
DEFAULT_PPL_TOKENS = 4096
DEFAULT_CONTEXT = 512
MAX_BATCH_TOKENS = 4096  # tokens per scoring forward (the pool permitting)

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


def check_gate(gate: dict[str, Any]) -> None:
    """ValueError naming an unknown key or a bad value of a `quality_gate` block."""
    unknown = sorted(set(gate) - set(GATE_KEYS))
    if unknown:
        raise ValueError(
            f"quality_gate key(s) {', '.join(unknown)} are not known; allowed: "
            f"{', '.join(GATE_KEYS)}"
        )
    for key in THRESHOLDS:
        v = gate.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"quality_gate.{key} ({v!r}) must be a number")
    for key in OPTIONS:
        v = gate.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"quality_gate.{key} ({v!r}) must be an integer >= 1")


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

_ids = itertools.count()


@torch.inference_mode()
def score_sequences(
    llm: LLM,
    sequences: Sequence[Sequence[int]],
    consume: Callable[[int, torch.Tensor], None],
    max_batch_tokens: int = MAX_BATCH_TOKENS,
) -> None:
    """Prefill each sequence (from position 0) through the engine's model and call
    `consume(i, hidden)` with its final hidden states [len(sequences[i]), hidden_size]
    (`llm.engine.runner.model.compute_logits(hidden[rows])` gives logits).

    Blocks come from the engine's KV-cache manager and are freed after each batch; several
    sequences share a forward up to `max_batch_tokens` tokens or the free blocks. The engine
    must have no unfinished requests."""
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise RuntimeError("score_sequences needs an idle engine (requests are in flight)")
    runner, kv = engine.runner, engine.scheduler.kv_cache_manager
    params = SamplingParams(temperature=0.0, max_tokens=1)
    i = 0
    while i < len(sequences):
        reqs: list[Any] = []
        batch: list[int] = []
        tokens = 0
        try:
            while i < len(sequences) and (
                not batch or tokens + len(sequences[i]) <= max_batch_tokens
            ):
                req = engine.make_request(list(sequences[i]), params,
                                          request_id=f"quality-{next(_ids)}")
                if kv.allocate_slots(req, len(req.all_token_ids)) is None:
                    kv.free(req)
                    if not batch:
                        raise RuntimeError(
                            f"the KV pool ({kv.num_free_blocks} free blocks) cannot hold a "
                            f"sequence of {len(sequences[i])} tokens for scoring"
                        )
                    break
                reqs.append(req)
                batch.append(i)
                tokens += len(req.all_token_ids)
                i += 1
            copies = kv.take_copy_ops()
            if copies:  # none expected: no request here shares a block
                runner.copy_blocks(copies)
            lens = [len(sequences[j]) for j in batch]
            flat = [int(t) for j in batch for t in sequences[j]]
            input_ids, positions, meta = runner.build_batch(
                flat, [0] * len(batch), lens, [kv.get_block_ids(r.request_id) for r in reqs]
            )
            hidden = runner.model(input_ids, positions, meta)
            start = 0
            for j, n in zip(batch, lens, strict=True):
                consume(j, hidden[start:start + n])
                start += n
        finally:
            for r in reqs:
                kv.free(r)


def held_out_ids(model: str | Path, num_tokens: int = DEFAULT_PPL_TOKENS) -> list[int]:
    """The first `num_tokens` + 1 tokens of the held-out stdlib split (the demo corpus's:
    every HOLDOUT_EVERY-th file of `workbench.testing.demo_pair.corpus_files()`), each file as
    "<s> ... </s>" with `model`'s tokenizer (what the demo's `token_stream` does, so for the
    demo model these are the first tokens `held_out_stream` gives); fewer if the split is
    shorter. Files are read only until there are enough tokens."""
    import sysconfig

    from workbench.models.tokenizer import load_tokenizer
    from workbench.named_models import resolve_model
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
    engine's model. Windows are capped at the engine's max_model_len."""
    context = min(int(context), int(llm.engine.max_model_len))
    stream = torch.as_tensor(list(ids), dtype=torch.long)
    n = len(stream) - 1
    starts = list(range(0, n, context))
    windows = [stream[s:min(s + context, n)].tolist() for s in starts]
    nll = [0.0] * len(windows)
    tops: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(windows)
    model = llm.engine.runner.model

    def consume(i: int, hidden: torch.Tensor) -> None:
        s = starts[i]
        target = stream[s + 1:s + 1 + hidden.shape[0]].to(hidden.device)
        logits = model.compute_logits(hidden).float()
        nll[i] = float(F.cross_entropy(logits, target, reduction="sum"))
        tops[i] = logits.argmax(-1).cpu()

    score_sequences(llm, windows, consume)
    argmax = torch.cat(tops) if tops else torch.empty(0, dtype=torch.long)
    return TextScore(max(n, 0), sum(nll), argmax)


def continuation_logprobs(
    llm: LLM, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Teacher-forced log-probabilities [len(continuation), vocab] (float32) of the next
    token at each continuation position: prompt + continuation[:-1] is prefilled and the rows
    from the prompt's last token on are scored."""
    model = llm.engine.runner.model
    seqs = [list(p) + list(c)[:-1] for p, c in zip(prompts, continuations, strict=True)]
    out: list[torch.Tensor] = [torch.empty(0)] * len(seqs)

    def consume(i: int, hidden: torch.Tensor) -> None:
        first = len(prompts[i]) - 1
        rows = hidden[first:first + len(continuations[i])]
        out[i] = F.log_softmax(model.compute_logits(rows).float(), dim=-1).cpu()

    score_sequences(llm, seqs, consume)
    return out


# ----------------------------------------------------------------------------- reference


@dataclass
class Reference:
    """What the reference config produced; reused against every candidate."""

    model: str
    config: dict[str, Any]
    prompts: list[list[int]]
    max_tokens: int
    tokens: list[list[int]]  # its greedy continuations
    logprobs: list[torch.Tensor] | None = field(default=None, repr=False)  # teacher-forced
    text: TextScore | None = None  # held-out text score (None: perplexity not measured)
    text_ids: list[int] | None = field(default=None, repr=False)
    context: int = DEFAULT_CONTEXT
    seconds: float = 0.0


def golden_prompts(model: str | Path, num_prompts: int | None = None) -> list[list[int]]:
    """GOLDEN_PROMPTS (cycled to `num_prompts`) tokenized with `model`'s tokenizer."""
    from workbench.models.tokenizer import load_tokenizer
    from workbench.named_models import resolve_model

    tok = load_tokenizer(resolve_model(model))
    n = len(GOLDEN_PROMPTS) if num_prompts is None else num_prompts
    return [list(tok(GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)])["input_ids"]) for i in range(n)]


def _llm(model: str, config: dict[str, Any] | LLM) -> tuple[LLM, dict[str, Any]]:
    from workbench import LLM

    if isinstance(config, LLM):
        return config, {}
    return LLM(model, **config), dict(config)


def reference(
    model: str | Path,
    config: dict[str, Any] | LLM | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    ppl_tokens: int | None = DEFAULT_PPL_TOKENS,
    context: int = DEFAULT_CONTEXT,
    kl: bool = True,
) -> Reference:
    """Run the reference config (default: the model in float32, unquantized): its greedy
    continuations of `prompts` (default: `golden_prompts`), their teacher-forced
    log-probabilities (when `kl`) and its held-out text score (`ppl_tokens` None: skipped)."""
    t0 = time.perf_counter()
    model = str(model)
    llm, cfg = _llm(model, {"dtype": "float32"} if config is None else config)
    prompts = golden_prompts(model) if prompts is None else [list(p) for p in prompts]
    tokens = generate_greedy(llm, prompts, max_tokens)
    ref = Reference(model, cfg, prompts, max_tokens, tokens, context=context)
    if kl:
        ref.logprobs = continuation_logprobs(llm, prompts, tokens)
    if ppl_tokens:
        ref.text_ids = held_out_ids(model, ppl_tokens)
        ref.text = score_text(llm, ref.text_ids, context)
    ref.seconds = time.perf_counter() - t0
    return ref


# ----------------------------------------------------------------------------- report


@dataclass
class QualityReport:
    """The candidate against the reference; None = not measured."""

    model: str
    reference_config: dict[str, Any]
    candidate_config: dict[str, Any]
    num_prompts: int
    max_tokens: int
    token_agreement: float
    first_divergence: list[int | None]
    identical_sequences: int
    mean_kl: float | None = None  # nats, over every continuation position
    max_kl: float | None = None
    top1_agreement: float | None = None  # argmax equal, continuation positions
    ppl_tokens: int | None = None
    reference_perplexity: float | None = None
    perplexity: float | None = None
    text_top1_agreement: float | None = None  # argmax equal, held-out text positions
    seconds: float = 0.0

    @property
    def ppl_increase_pct(self) -> float | None:
        if self.perplexity is None or self.reference_perplexity is None:
            return None
        return 100.0 * (self.perplexity / self.reference_perplexity - 1.0)

    def figures(self) -> dict[str, float | None]:
        """The gated figures, keyed like the thresholds' subjects."""
        return {
            "token_agreement": self.token_agreement,
            "ppl_increase_pct": self.ppl_increase_pct,
            "mean_kl": self.mean_kl,
            "top1_agreement": self.top1_agreement,
        }

    def passes(self, thresholds: dict[str, Any] | None) -> tuple[bool, list[str]]:
        """(all thresholds met, one sentence per miss). Unknown keys raise ValueError; option
        keys (num_prompts, ...) are ignored; a threshold on an unmeasured figure fails."""
        gate = dict(thresholds or {})
        check_gate(gate)
        reasons = []
        fig = self.figures()
        checks = (
            ("min_token_agreement", "token_agreement", ">=", ".3f"),
            ("max_ppl_increase_pct", "ppl_increase_pct", "<=", "+.3f"),
            ("max_mean_kl", "mean_kl", "<=", ".3g"),
            ("min_top1_agreement", "top1_agreement", ">=", ".3f"),
        )
        for key, name, op, fmt in checks:
            bound = gate.get(key)
            if bound is None:
                continue
            value = fig[name]
            if value is None:
                reasons.append(f"{THRESHOLDS[key]} was not measured ({key}: {bound})")
                continue
            ok = value >= bound if op == ">=" else value <= bound
            if not ok:
                bad = "<" if op == ">=" else ">"
                extra = ""
                if name == "token_agreement":
                    extra = f" (first divergence per prompt: {self.first_divergence})"
                elif name == "ppl_increase_pct":
                    extra = (f" (perplexity {self.perplexity:.4f} vs reference "
                             f"{self.reference_perplexity:.4f})")
                reasons.append(f"{THRESHOLDS[key]} {value:{fmt}} {bad} {bound}{extra}")
        return not reasons, reasons

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ppl_increase_pct": self.ppl_increase_pct}

    def row(self) -> dict[str, Any]:
        """A flat row for a table."""
        return {
            "perplexity": self.perplexity, "ppl_increase_pct": self.ppl_increase_pct,
            "mean_kl": self.mean_kl, "max_kl": self.max_kl,
            "top1_agreement": self.top1_agreement,
            "text_top1_agreement": self.text_top1_agreement,
            "token_agreement": self.token_agreement,
            "identical_sequences": f"{self.identical_sequences}/{self.num_prompts}",
            "first_divergence": self.first_divergence,
        }


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


def evaluate(
    model: str | Path,
    candidate: dict[str, Any] | LLM,
    ref: Reference | None = None,
    *,
    baseline: dict[str, Any] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    ppl_tokens: int | None = DEFAULT_PPL_TOKENS,
    context: int = DEFAULT_CONTEXT,
    kl: bool = True,
) -> QualityReport:
    """The candidate config (or a built, idle LLM) against `ref` (built here from `baseline`,
    default float32 unquantized, when not given; the keyword options then apply). What the
    reference measured is what the report holds."""
    model = str(model)
    if ref is None:
        ref = reference(model, baseline, prompts, max_tokens=max_tokens, ppl_tokens=ppl_tokens,
                        context=context, kl=kl)
    t0 = time.perf_counter()
    llm, cfg = _llm(model, candidate)
    tokens = generate_greedy(llm, ref.prompts, ref.max_tokens)
    agr = agreement(ref.tokens, tokens)
    rep = QualityReport(
        model=model, reference_config=ref.config, candidate_config=cfg,
        num_prompts=len(ref.prompts), max_tokens=ref.max_tokens,
        token_agreement=agr["token_agreement"], first_divergence=agr["first_divergence"],
        identical_sequences=agr["identical_sequences"],
    )
    if ref.logprobs is not None:
        cand = continuation_logprobs(llm, ref.prompts, ref.tokens)
        rep.mean_kl, rep.max_kl, rep.top1_agreement = kl_and_top1(ref.logprobs, cand)
    if ref.text is not None and ref.text_ids is not None:
        text = score_text(llm, ref.text_ids, ref.context)
        rep.ppl_tokens = text.tokens
        rep.reference_perplexity = ref.text.perplexity
        rep.perplexity = text.perplexity
        rep.text_top1_agreement = (
            float((text.argmax == ref.text.argmax).float().mean()) if text.tokens else 1.0)
    rep.seconds = time.perf_counter() - t0
    return rep


def needs(gate: dict[str, Any] | None) -> dict[str, bool]:
    """Which measurements a gate's thresholds need: {"kl": ..., "perplexity": ...}."""
    g = gate or {}
    return {
        "kl": g.get("max_mean_kl") is not None or g.get("min_top1_agreement") is not None,
        "perplexity": g.get("max_ppl_increase_pct") is not None,
    }
