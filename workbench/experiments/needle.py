"""The needle (passkey) task through the engine: accuracy by depth and context length.

    rep = run_needle("needle", {"kv_compression_config": {"method": "streaming_llm",
                                                          "budget_tokens": 64}})
    print(rep.table())          # depth x length grid, overall accuracy
    rep.accuracy, rep.cells()   # 0.43, {(1024, 0.5): 0.0, ...}

    workbench needle --model needle [--engine JSON] [--lengths 128 256 ...]
                     [--depths 0 0.5 1] [--cases-per-cell 4] [--seed 0]
                     [--export cases.jsonl [--export-only]] [--json report.json]

The cases (`workbench.testing.needle_cases`): a prompt of exactly `length` tokens of held-out
stdlib code with one `PASSKEY = 48213` line at `depth` (0 = first, 1 = last before the
question) and `# What is PASSKEY?\\nPASSKEY =` at the end; `cases_per_cell` seeded passkeys
per (length, depth). Every case runs through `LLM.generate` with the given engine knobs
(`kv_compression_config`, `kv_cache_dtype`, quantization, ...), greedy, `max_tokens` = the
answer's tokens + 2; a case is correct when the generated text's first digits are exactly the
passkey. A case the engine fails counts as wrong and keeps its error.

`--export` writes the cases as JSONL, one object per line: case_id, context_tokens, depth,
prompt (the whole text fed to the model; the model's tokenizer, which prepends "<s>", turns it
into exactly context_tokens ids), answer (the digits), max_tokens, needle_token_index (where
the needle's first token sits in those ids): what a peer (kvpress) reads to run the same task.

The quality gate's `needle` block (`workbench.experiments.quality_report`) runs this grid on
the baseline and on every variant.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.sampling_params import SamplingParams
from workbench.testing.needle_cases import (
    DEFAULT_CASES_PER_CELL,
    DEFAULT_DEPTHS,
    DEFAULT_LENGTHS,
    DEFAULT_SEED,
    Haystack,
    NeedleCase,
    make_grid,
    passkey_correct,
    passkey_of,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from workbench.engine.llm import LLM

DEFAULT_MODEL = "needle"


@dataclass
class CaseResult:
    case_id: str
    context_tokens: int
    depth: float
    answer: str
    output: str  # the generated text
    predicted: str | None  # its first digits
    correct: bool
    error: str | None = None  # the engine failed this case


@dataclass
class NeedleReport:
    """One engine config's answers on one grid."""

    model: str
    engine: dict[str, Any]
    lengths: list[int]
    depths: list[float]
    cases_per_cell: int
    seed: int
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def correct(self) -> int:
        return sum(r.correct for r in self.results)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.results) if self.results else 0.0

    def cells(self) -> dict[tuple[int, float], float]:
        """{(length, depth): accuracy}."""
        groups: dict[tuple[int, float], list[bool]] = {}
        for r in self.results:
            groups.setdefault((r.context_tokens, r.depth), []).append(r.correct)
        return {k: sum(v) / len(v) for k, v in groups.items()}

    def worst_cells(self, n: int = 3) -> list[tuple[int, float, float]]:
        """The `n` cells with the lowest accuracy below 1 (length, depth, accuracy)."""
        low = sorted((a, length, d) for (length, d), a in self.cells().items() if a < 1.0)
        return [(length, d, a) for a, length, d in low[:n]]

    def table(self) -> str:
        """Rows = depths, columns = lengths, each cell `correct/cases`; a total per column."""
        cells: dict[tuple[int, float], list[bool]] = {}
        for r in self.results:
            cells.setdefault((r.context_tokens, r.depth), []).append(r.correct)
        head = ["depth \\ length", *[str(n) for n in self.lengths], "all"]
        rows = [head]
        for d in self.depths:
            row = [f"{d:g}"]
            for n in self.lengths:
                v = cells.get((n, float(d)), [])
                row.append(f"{sum(v)}/{len(v)}")
            hits = [x for n in self.lengths for x in cells.get((n, float(d)), [])]
            row.append(f"{sum(hits) / len(hits):.2f}" if hits else "-")
            rows.append(row)
        tot = ["all"]
        for n in self.lengths:
            hits = [x for d in self.depths for x in cells.get((n, float(d)), [])]
            tot.append(f"{sum(hits) / len(hits):.2f}" if hits else "-")
        tot.append(f"{self.accuracy:.3f}")
        rows.append(tot)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"
                 for r in rows]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines)

    def summary(self) -> str:
        knobs = json.dumps(self.engine, sort_keys=True) if self.engine else "{}"
        errors = sum(r.error is not None for r in self.results)
        return (f"needle accuracy {self.correct}/{len(self.results)} = {self.accuracy:.3f} "
                f"(model {self.model}, engine {knobs}, {self.seconds:.1f} s"
                + (f", {errors} case(s) failed in the engine" if errors else "") + ")")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy": self.accuracy, "correct": self.correct,
                "cells": {f"{n}/{d:g}": a for (n, d), a in self.cells().items()}}


# ----------------------------------------------------------------------------- cases


def load_tokenizer(model: str | Path) -> Tokenizer:
    """The `tokenizers` tokenizer of a model folder or shipped name (tokenizer.json)."""
    from tokenizers import Tokenizer

    from workbench.config.named_models import resolve_model

    folder = Path(resolve_model(model))
    if not folder.is_dir():
        from workbench.config.named_models import NAMED_MODELS

        raise ValueError(f"model ({str(model)!r}) is neither a local folder nor a shipped name "
                         f"({', '.join(NAMED_MODELS)})")
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"model ({str(model)!r}) has no tokenizer.json; the needle task "
                         "builds its cases with the model's own tokenizer")
    return Tokenizer.from_file(str(path))


def needle_cases(
    model: str | Path,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    cases_per_cell: int = DEFAULT_CASES_PER_CELL,
    seed: int = DEFAULT_SEED,
) -> list[NeedleCase]:
    """The grid's cases with `model`'s tokenizer (held-out haystack)."""
    return make_grid(Haystack.from_stdlib(load_tokenizer(model), "held_out"),
                     lengths, depths, cases_per_cell, seed)


def export_jsonl(cases: Sequence[NeedleCase], path: str | Path) -> Path:
    """One `NeedleCase.as_json()` object per line (module docstring)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(c.as_json()) + "\n" for c in cases))
    return out


def score_outputs(cases: Sequence[NeedleCase], outputs: Sequence[str],
                  errors: Sequence[str | None] | None = None) -> list[CaseResult]:
    """Exact-match scoring of generated texts (one per case, in order)."""
    errs = list(errors) if errors is not None else [None] * len(cases)
    return [
        CaseResult(c.case_id, c.context_tokens, c.depth, c.answer, text, passkey_of(text),
                   err is None and passkey_correct(text, c.answer), err)
        for c, text, err in zip(cases, outputs, errs, strict=True)
    ]


# ----------------------------------------------------------------------------- engine


def _engine(model: str | Path, engine: dict[str, Any] | LLM | None) -> tuple[LLM, dict[str, Any]]:
    from workbench import LLM

    if isinstance(engine, LLM):
        return engine, {}
    cfg = dict(engine or {})
    return LLM(str(model), **cfg), cfg


def run_cases(llm: LLM, cases: Sequence[NeedleCase]) -> list[CaseResult]:
    """Every case through `llm.generate` (greedy), scored."""
    limit = int(llm.config.model_config.max_model_len)
    for c in cases:
        if c.context_tokens + c.max_tokens > limit:
            raise ValueError(f"needle length {c.context_tokens} + {c.max_tokens} answer tokens "
                             f"exceeds max_model_len ({limit}); use shorter --lengths")
    params = [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in cases]
    outs = llm.generate([{"prompt_token_ids": list(c.prompt_token_ids)} for c in cases], params)
    texts = [o.outputs[0].text if o.outputs else "" for o in outs]
    errors = [o.outputs[0].error if o.outputs else "no output" for o in outs]
    return score_outputs(cases, texts, errors)


def run_needle(
    model: str | Path = DEFAULT_MODEL,
    engine: dict[str, Any] | LLM | None = None,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    cases_per_cell: int = DEFAULT_CASES_PER_CELL,
    seed: int = DEFAULT_SEED,
    cases: Sequence[NeedleCase] | None = None,
) -> NeedleReport:
    """The needle grid on `LLM(model, **engine)` (or a built, idle LLM); `cases`: the grid's
    cases when already built (`needle_cases` with the same arguments)."""
    if cases is None:
        cases = needle_cases(model, lengths, depths, cases_per_cell, seed)
    t0 = time.perf_counter()
    llm, cfg = _engine(model, engine)
    results = run_cases(llm, cases)
    return NeedleReport(str(model), cfg, list(lengths), [float(d) for d in depths],
                        cases_per_cell, seed, results, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- CLI


def _engine_arg(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--engine must be a JSON object of engine knobs: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--engine must be a JSON object of engine knobs; got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="workbench needle", description="Passkey retrieval accuracy by depth and context "
        "length through the engine (docs/kv_compression.md, Quality gate).")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model folder or shipped name "
                    "(default: needle, the passkey-trained demo model)")
    ap.add_argument("--engine", default=None, metavar="JSON",
                    help='engine knobs, e.g. \'{"kv_compression_config": {"method": '
                         '"streaming_llm", "budget_tokens": 64}}\'')
    ap.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS),
                    metavar="N", help="prompt lengths in tokens (default 128 256 512 1024)")
    ap.add_argument("--depths", type=float, nargs="+", default=list(DEFAULT_DEPTHS),
                    metavar="D", help="needle depths in [0, 1] (default 0 0.25 0.5 0.75 1)")
    ap.add_argument("--cases-per-cell", type=int, default=DEFAULT_CASES_PER_CELL, metavar="K")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--export", default=None, metavar="CASES.jsonl",
                    help="write the cases as JSONL (for a peer such as kvpress)")
    ap.add_argument("--export-only", action="store_true", help="with --export: do not run")
    ap.add_argument("--json", default=None, metavar="OUT.json", help="write the report")
    args = ap.parse_args(argv)
    engine = _engine_arg(args.engine)
    if args.export_only and not args.export:
        raise ValueError("--export-only needs --export CASES.jsonl")
    cases = needle_cases(args.model, args.lengths, args.depths, args.cases_per_cell, args.seed)
    if args.export:
        print(f"wrote {len(cases)} cases to {export_jsonl(cases, args.export)}")
        if args.export_only:
            return 0
    rep = run_needle(args.model, engine, lengths=args.lengths, depths=args.depths,
                     cases_per_cell=args.cases_per_cell, seed=args.seed, cases=cases)
    print(rep.table())
    print(rep.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(rep.as_dict(), indent=2) + "\n")
    return 0
