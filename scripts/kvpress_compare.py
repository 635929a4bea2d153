"""Our KV eviction policies against NVIDIA's kvpress on the needle task: accuracy side by side
at equal budgets (issue 34, "The peer"; docs/kv_compression_peer.md).

    make peer-kvpress                                       # once: .peers/kvpress
    .venv/bin/workbench needle --model needle --export cases.jsonl --export-only
    .venv/bin/python scripts/kvpress_compare.py --cases cases.jsonl [--model needle] \
        [--methods streaming_llm h2o snapkv pyramidkv] [--budget-ratios 0.5 0.25 0.125] \
        [--budget-tokens 64 128] [--half both|kvpress|ours] [--split whole|question] \
        [--out-dir .bench/kvpress_compare] [--limit N]

Both halves get the same token ids (the workbench tokenizer's) and decode greedily:
- kvpress: scripts/kvpress_side.py in .peers/kvpress's python (no workbench import there),
  one press per method (H2O's nearest is ObservedAttentionPress), compression_ratio chosen
  per case so that kvpress keeps exactly the prompt tokens our engine holds (below);
- ours: `workbench.LLM(model, kv_compression_config=...)`, one engine per method x budget,
  prefix caching and chunked prefill off (each prompt is prefilled whole, then evicted).
Budget equivalence: our budget B (budget_tokens, or round(budget_ratio x prompt length)) is
held in m = ceil(B / 16) KV blocks; streaming_llm and h2o count the block the first
generated token goes to among them, snapkv and pyramidkv (per layer) count prompt blocks
only, so for a prompt of n tokens we keep K = 16 (m - 1) + n mod 16 (streaming_llm, h2o) or
16 (m - 1) + the tokens of the prompt's last block (snapkv; pyramidkv: the mean over layers
of its per-layer budgets so rounded) prompt tokens per layer (`our_kept_tokens`). kvpress
removes compression_ratio x n tokens: we pass (n - K) / n, so that it keeps exactly K
(`kvpress_compression_ratio`; the side script reports the cache length it kept per layer).
Without --cases the grid is exported first (--lengths, --depths, --cases-per-cell). Outputs
(in --out-dir): accuracy.csv (side, method, budget, context_tokens, depth, n, correct),
comparison.md (the side-by-side table, the budget mapping, accuracy per length), and each
half's raw JSONL (kvpress_results.jsonl, ours_results.jsonl).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = ROOT / ".peers" / "kvpress" / "bin" / "python"
SIDE = ROOT / "scripts" / "kvpress_side.py"
BLOCK_SIZE = 16
METHODS = ("streaming_llm", "h2o", "snapkv", "pyramidkv")
# our method -> the kvpress press that implements it (None: no compression)
PRESS_FOR = {"none": None, "streaming_llm": "StreamingLLMPress",
             "h2o": "ObservedAttentionPress", "snapkv": "SnapKVPress",
             "pyramidkv": "PyramidKVPress"}
CASE_FIELDS = {"case_id": str, "context_tokens": int, "depth": float, "prompt": str,
               "answer": str, "max_tokens": int}


@dataclass(frozen=True)
class NeedleCase:
    case_id: str
    context_tokens: int
    depth: float
    prompt: str
    answer: str
    max_tokens: int
    question: str | None = None  # optional: the prompt's tail, for --split question


def read_cases(path: str | Path) -> list[NeedleCase]:
    """The needle cases of a JSONL export (one ValueError naming the line and field)."""
    cases: list[NeedleCase] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        values: dict[str, Any] = {}
        for name, kind in CASE_FIELDS.items():
            v = row.get(name)
            ok = (isinstance(v, int | float) and not isinstance(v, bool) if kind is float
                  else isinstance(v, kind) and not isinstance(v, bool))
            if not ok:
                raise ValueError(f"{path}:{lineno}: field {name!r} ({v!r}) must be a "
                                 f"{kind.__name__}")
            values[name] = float(v) if kind is float else v
        q = row.get("question")
        cases.append(NeedleCase(**values, question=q if isinstance(q, str) else None))
    if not cases:
        raise ValueError(f"{path} holds no needle case")
    return cases


@dataclass(frozen=True)
class Budget:
    """One budget of the grid: a fraction of the prompt kept, or a number of tokens."""

    ratio: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.ratio is None) == (self.tokens is None):
            raise ValueError("Budget needs exactly one of ratio or tokens")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError(f"budget ratio ({self.ratio!r}) must be in (0, 1]")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"budget tokens ({self.tokens!r}) must be >= 1")

    @property
    def label(self) -> str:
        return f"ratio {self.ratio:g}" if self.ratio is not None else f"{self.tokens} tok"

    def tokens_for(self, num_prompt_tokens: int) -> int:
        """Our budget for this prompt (KVCompressionConfig.budget_for's arithmetic)."""
        if self.tokens is not None:
            return self.tokens
        assert self.ratio is not None
        return max(1, int(self.ratio * num_prompt_tokens + 0.5))

    def knob(self) -> dict[str, Any]:
        return ({"budget_ratio": self.ratio} if self.ratio is not None
                else {"budget_tokens": self.tokens})


@dataclass(frozen=True)
class MethodParams:
    """The method knobs both sides get (ours rounds sinks and windows up to blocks)."""

    sink_tokens: int = 4
    window_size: int = 32
    kernel_size: int = 5
    beta: int = 20


def _held_with_new_block(n: int, m: int, bs: int) -> int:
    """streaming_llm, h2o: m blocks held, one of them the block the first generated token
    (position n) goes to: the prompt's partial last block (n mod bs prompt tokens in it) or,
    for n a multiple of bs, a fresh one."""
    return max(1, min(n, bs * (m - 1) + n % bs))


def _prompt_blocks_held(n: int, m: int, bs: int) -> int:
    """snapkv and each pyramidkv layer: m prompt blocks, the prompt's last one among them
    (the observation window ends there); all of the prompt when it spans <= m blocks."""
    blocks = -(-n // bs)
    if blocks <= m:
        return n
    return bs * (m - 1) + n - bs * (blocks - 1)


def our_kept_tokens(method: str, num_prompt_tokens: int, budget_tokens: int,
                    p: MethodParams, num_layers: int = 1, block_size: int = BLOCK_SIZE
                    ) -> float:
    """Prompt tokens our engine keeps per layer (pyramidkv: the mean over layers) once it has
    evicted, i.e. at the first decode step: the budget in m = ceil(budget / bs) blocks, as
    each policy counts them (workbench/core/kv_cache/compression/)."""
    n, bs = num_prompt_tokens, block_size
    m = -(-budget_tokens // bs)
    if method == "streaming_llm":  # sinks + a window of at least one block
        return float(_held_with_new_block(n, max(m, -(-p.sink_tokens // bs) + 1), bs))
    if method == "h2o":
        return float(_held_with_new_block(n, m, bs))
    first = max(0, n - p.window_size)
    window = (n - 1) // bs - first // bs + 1  # blocks holding the observation window
    if method == "snapkv":
        return float(_prompt_blocks_held(n, max(m, window), bs))
    if method == "pyramidkv":
        from workbench.core.kv_cache.compression.pyramidkv import pyramid_budgets

        layers = pyramid_budgets(budget_tokens, p.window_size, n, p.beta, num_layers)
        kept = [_prompt_blocks_held(n, max(-(-b // bs), window), bs) for b in layers]
        return sum(kept) / len(kept)
    raise ValueError(f"method ({method!r}) must be one of {', '.join(METHODS)}")


def kvpress_compression_ratio(num_tokens: int, kept: float) -> float:
    """The compression_ratio with which kvpress keeps `kept` of `num_tokens` tokens: exactly
    for a whole number (its ScorerPress keeps int(n * (1 - ratio))); a mean over layers
    (pyramidkv) is kvpress's own mean, n * (1 - ratio)."""
    if not 1 <= kept <= num_tokens:
        raise ValueError(f"kept ({kept}) must be in [1, {num_tokens}]")
    ratio = (num_tokens - kept) / num_tokens
    if not float(kept).is_integer():
        return ratio
    while ratio > 0 and int(num_tokens * (1 - ratio)) < kept:  # float rounding: nudge down
        ratio = math.nextafter(ratio, 0.0)
    assert int(num_tokens * (1 - ratio)) == kept
    return ratio


def press_kwargs(method: str, ratio: float, p: MethodParams) -> dict[str, Any]:
    """kvpress's constructor arguments for `method` (StreamingLLM's sinks: our block-rounded
    count, so both keep the same sink tokens)."""
    if method == "streaming_llm":
        return {"compression_ratio": ratio,
                "n_sink": -(-p.sink_tokens // BLOCK_SIZE) * BLOCK_SIZE}
    if method == "h2o":
        return {"compression_ratio": ratio}
    if method == "snapkv":
        return {"compression_ratio": ratio, "window_size": p.window_size,
                "kernel_size": p.kernel_size}
    if method == "pyramidkv":
        return {"compression_ratio": ratio, "window_size": p.window_size,
                "kernel_size": p.kernel_size, "beta": p.beta}
    raise ValueError(f"method ({method!r}) must be one of {', '.join(METHODS)}")


def our_config(method: str, budget: Budget, p: MethodParams) -> dict[str, Any]:
    """Our `kv_compression_config` for `method` (kvpress's SnapKV pools with a mean)."""
    cfg: dict[str, Any] = {"method": method, **budget.knob()}
    if method == "streaming_llm":
        cfg["sink_tokens"] = p.sink_tokens
    elif method in ("snapkv", "pyramidkv"):
        cfg.update(window_size=p.window_size, kernel_size=p.kernel_size, pooling="avg")
        if method == "pyramidkv":
            cfg["beta"] = float(p.beta)
    elif method != "h2o":
        raise ValueError(f"method ({method!r}) must be one of {', '.join(METHODS)}")
    return cfg


def grid(methods: Sequence[str], budgets: Sequence[Budget]) -> list[tuple[str, Budget | None]]:
    """("none", None) first, then every method x budget."""
    return [("none", None)] + [(m, b) for m in methods for b in budgets]


def question_start(case: NeedleCase, ids: list[int], tokenize: Callable[[str], list[int]],
                   default_question: str | None = None) -> int:
    """Where the question's tokens start in `ids` (kvpress's context/question split): the
    case's 'question' field, else `default_question` (the needle task's fixed question)."""
    question = case.question or default_question
    if question is None or not case.prompt.endswith(question):
        raise ValueError(f"case {case.case_id}: --split question needs a 'question' field "
                         "that ends the prompt")
    head = tokenize(case.prompt[: len(case.prompt) - len(question)])
    if ids[: len(head)] != head or len(head) >= len(ids):
        raise ValueError(f"case {case.case_id}: the context's tokens are not a prefix of the "
                         "prompt's (the split falls inside a token)")
    return len(head)


def kvpress_jobs(cases: Sequence[NeedleCase], ids: Sequence[list[int]],
                 cells: Sequence[tuple[str, Budget | None]], p: MethodParams,
                 eos_token_ids: list[int], starts: Sequence[int | None] | None = None,
                 num_layers: int = 1, max_model_len: int | None = None
                 ) -> list[dict[str, Any]]:
    """One job per case x (method, budget) for scripts/kvpress_side.py. max_tokens is capped
    as our engine caps it (it stops once prompt + output reach max_model_len)."""
    jobs = []
    for method, budget in cells:
        for i, (case, tok) in enumerate(zip(cases, ids, strict=True)):
            n = len(tok)
            job: dict[str, Any] = {
                "job_id": f"{method}|{budget.label if budget else 'full'}|{case.case_id}",
                "press": None, "press_kwargs": {}, "prompt_token_ids": tok,
                "question_start": starts[i] if starts else None,
                "max_tokens": (case.max_tokens if max_model_len is None
                               else max(1, min(case.max_tokens, max_model_len - n))),
                "eos_token_ids": eos_token_ids}
            if budget is not None:
                kept = our_kept_tokens(method, n, budget.tokens_for(n), p, num_layers)
                job["press"] = PRESS_FOR[method]
                # --split question: kvpress compresses the context only and keeps the
                # question whole; the context keeps what leaves the same total KV
                n_ctx = job["question_start"] or n
                kept_ctx = max(1, min(n_ctx, kept - (n - n_ctx)))
                job["press_kwargs"] = press_kwargs(
                    method, kvpress_compression_ratio(n_ctx, kept_ctx), p)
            jobs.append(job)
    return jobs


def is_correct(answer: str, text: str) -> bool:
    """The quality gate's rule: the output's first digits are exactly the passkey."""
    from workbench.testing.needle_cases import passkey_correct

    return passkey_correct(text, answer)


@dataclass(frozen=True)
class Outcome:
    side: str  # "kvpress" | "ours"
    method: str
    budget: str
    case: NeedleCase
    token_ids: tuple[int, ...]
    correct: bool


def accuracy_rows(outcomes: Iterable[Outcome]) -> list[dict[str, Any]]:
    """Correct / n per side, method, budget, context length and depth (sorted)."""
    cells: dict[tuple[str, str, str, int, float], list[int]] = defaultdict(lambda: [0, 0])
    for o in outcomes:
        c = cells[(o.side, o.method, o.budget, o.case.context_tokens, o.case.depth)]
        c[0] += 1
        c[1] += int(o.correct)
    return [{"side": k[0], "method": k[1], "budget": k[2], "context_tokens": k[3],
             "depth": k[4], "n": v[0], "correct": v[1]} for k, v in sorted(cells.items())]


def _pct(correct: int, n: int) -> str:
    return f"{100 * correct / n:.1f}" if n else "-"


def comparison_table(outcomes: Sequence[Outcome],
                     cells: Sequence[tuple[str, Budget | None]]) -> str:
    """Markdown: per method x budget, both accuracies (%), ours - kvpress (points), and the
    fraction of cases where both generated the same tokens."""
    by: dict[tuple[str, str, str], dict[str, Outcome]] = defaultdict(dict)
    for o in outcomes:
        by[(o.method, o.budget, o.side)][o.case.case_id] = o
    lines = ["| method | kvpress press | budget | cases | kvpress acc % | ours acc % | "
             "ours - kvpress (pts) | same tokens % |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for method, budget in cells:
        label = budget.label if budget else "full"
        kv, ours = by.get((method, label, "kvpress"), {}), by.get((method, label, "ours"), {})
        n_kv, n_ours = len(kv), len(ours)
        a_kv = sum(o.correct for o in kv.values())
        a_ours = sum(o.correct for o in ours.values())
        both = sorted(set(kv) & set(ours))
        same = sum(kv[c].token_ids == ours[c].token_ids for c in both)
        diff = (f"{100 * (a_ours / n_ours - a_kv / n_kv):+.1f}" if n_kv and n_ours else "-")
        lines.append(f"| {method} | {PRESS_FOR[method] or '(none)'} | {label} | "
                     f"{max(n_kv, n_ours)} | {_pct(a_kv, n_kv)} | {_pct(a_ours, n_ours)} | "
                     f"{diff} | {_pct(same, len(both))} |")
    return "\n".join(lines)


def mapping_table(lengths: Sequence[int], budgets: Sequence[Budget], methods: Sequence[str],
                  p: MethodParams, num_layers: int = 1) -> str:
    """Markdown: per prompt length, budget and method, our budget in tokens and blocks, the
    prompt tokens we keep per layer and kvpress's compression_ratio for the same count."""
    lines = ["| prompt tokens | budget | our budget (tokens) | budget blocks (16 tok) | "
             "method | prompt tokens kept per layer | kvpress compression_ratio |",
             "|---:|---|---:|---:|---|---:|---:|"]
    for n in sorted(set(lengths)):
        for b in budgets:
            bt = b.tokens_for(n)
            for method in methods:
                kept = our_kept_tokens(method, n, bt, p, num_layers)
                lines.append(f"| {n} | {b.label} | {bt} | {-(-bt // BLOCK_SIZE)} | {method} "
                             f"| {kept:g} | {kvpress_compression_ratio(n, kept):.4f} |")
    return "\n".join(lines)


def length_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: accuracy % by context length, one line per method x budget x side."""
    lengths = sorted({r["context_tokens"] for r in rows})
    acc: dict[tuple[str, str, str], dict[int, list[int]]] = defaultdict(
        lambda: defaultdict(lambda: [0, 0]))
    for r in rows:
        c = acc[(r["method"], r["budget"], r["side"])][r["context_tokens"]]
        c[0] += r["n"]
        c[1] += r["correct"]
    head = "| method | budget | side | " + " | ".join(f"{n} tok" for n in lengths) + " |"
    lines = [head, "|---|---|---|" + "---:|" * len(lengths)]
    rank = {m: i for i, m in enumerate(("none", *METHODS))}
    def budget_key(label: str) -> tuple[int, float]:  # full, then ratios, then tokens
        kind, _, value = label.partition(" ")
        return ((0, 0.0) if label == "full" else (1, -float(value)) if kind == "ratio"
                else (2, float(kind)))

    for (method, budget, side), per in sorted(
            acc.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0][0],
                                         budget_key(kv[0][1]), kv[0][2])):
        cells = " | ".join(_pct(per[n][1], per[n][0]) if n in per else "-" for n in lengths)
        lines.append(f"| {method} | {budget} | {side} | {cells} |")
    return "\n".join(lines)


def write_accuracy_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["side", "method", "budget", "context_tokens",
                                           "depth", "n", "correct"])
        w.writeheader()
        w.writerows(rows)


# ------------------------------------------------------------------ the two halves (heavy)
def run_kvpress(jobs: list[dict[str, Any]], model_dir: str, python: Path, out_dir: Path,
                timeout_s: float) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Run the side script; job_id -> output ids, and its meta (versions, seconds)."""
    jobs_path, res_path = out_dir / "kvpress_jobs.jsonl", out_dir / "kvpress_results.jsonl"
    meta_path = out_dir / "kvpress_meta.json"
    jobs_path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    cmd = [str(python), str(SIDE), "--model", model_dir, "--jobs", str(jobs_path),
           "--out", str(res_path), "--meta", str(meta_path)]
    print("kvpress: " + " ".join(cmd), flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    rc = subprocess.run(cmd, env=env, timeout=timeout_s).returncode
    if rc != 0:
        raise RuntimeError(f"scripts/kvpress_side.py exited {rc}")
    results = {}
    kv_kept: dict[str, float] = {}
    for line in res_path.read_text().splitlines():
        r = json.loads(line)
        results[r["job_id"]] = r["output_token_ids"]
        kv_kept[r["job_id"]] = sum(r["kv_tokens_per_layer"]) / len(r["kv_tokens_per_layer"])
    meta = json.loads(meta_path.read_text())
    meta["mean_kv_tokens"] = kv_kept
    return results, meta


def run_ours(cases: Sequence[NeedleCase], ids: Sequence[list[int]],
             cells: Sequence[tuple[str, Budget | None]], model: str, p: MethodParams
             ) -> dict[tuple[str, str], list[list[int]]]:
    """(method, budget label) -> output ids per case, one engine per cell (a cell whose
    engine refuses its knobs is skipped, and says why)."""
    from workbench import LLM, SamplingParams

    longest = max(len(t) for t in ids) + max(c.max_tokens for c in cases)
    out: dict[tuple[str, str], list[list[int]]] = {}
    for method, budget in cells:
        label = budget.label if budget else "full"
        knobs: dict[str, Any] = {"block_size": BLOCK_SIZE, "enable_prefix_caching": False,
                                 "enable_chunked_prefill": False,
                                 "max_num_batched_tokens": max(8192, longest)}
        if budget is not None:
            knobs["kv_compression_config"] = our_config(method, budget, p)
        t0 = time.perf_counter()
        try:
            llm = LLM(model, **knobs)
        except ValueError as e:  # e.g. a method whose policy has not landed
            print(f"ours: {method} {label}: skipped: {e}", flush=True)
            continue
        with llm:
            params = [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in cases]
            res = llm.generate([{"prompt_token_ids": t} for t in ids], params)
        out[(method, label)] = [list(r.outputs[0].token_ids) for r in res]
        print(f"ours: {method} {label}: {len(cases)} cases in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return out


def expected_kept(job: dict[str, Any]) -> float:
    """The KV tokens per layer (mean) a whole-prompt kvpress job should keep."""
    n = len(job["prompt_token_ids"])
    ratio = job["press_kwargs"].get("compression_ratio")
    return float(n) if ratio is None else n * (1 - ratio)


def strip_eos(ids: Sequence[int], eos: Sequence[int]) -> tuple[int, ...]:
    out = list(ids)
    while out and out[-1] in eos:
        out.pop()
    return tuple(out)


def machine_line() -> str:
    from workbench.platforms.cpu_info import cpu_model_name, isa

    return f"{cpu_model_name()}, {os.cpu_count()} cores, ISA {isa()}"


def export_cases(model: str, path: Path, grid_args: list[str]) -> None:
    """`workbench needle --model MODEL --export PATH --export-only [grid]`."""
    cli = Path(sys.executable).parent / "workbench"
    subprocess.run([str(cli), "needle", "--model", model, "--export", str(path),
                    "--export-only", *grid_args], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="needle cases JSONL (default: export them from --model)")
    ap.add_argument("--model", default="needle", help="a named model or a local folder")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--budget-ratios", nargs="*", type=float, default=[0.5, 0.25, 0.125])
    ap.add_argument("--budget-tokens", nargs="*", type=int, default=[])
    ap.add_argument("--half", choices=("both", "kvpress", "ours"), default="both")
    ap.add_argument("--split", choices=("whole", "question"), default="whole",
                    help="whole: kvpress compresses the whole prompt as our engine does; "
                         "question: kvpress's own context/question split")
    ap.add_argument("--sink-tokens", type=int, default=MethodParams.sink_tokens)
    ap.add_argument("--window-size", type=int, default=MethodParams.window_size)
    ap.add_argument("--kernel-size", type=int, default=MethodParams.kernel_size)
    ap.add_argument("--beta", type=int, default=MethodParams.beta)
    ap.add_argument("--limit", type=int, help="the first N cases only")
    ap.add_argument("--lengths", nargs="+", help="without --cases: the exported grid's lengths")
    ap.add_argument("--depths", nargs="+", help="without --cases: the exported grid's depths")
    ap.add_argument("--cases-per-cell", help="without --cases: cases per length x depth")
    ap.add_argument("--kvpress-python", default=str(PEER_PYTHON))
    ap.add_argument("--out-dir", default=".bench/kvpress_compare")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    args = ap.parse_args(argv)

    peer = Path(args.kvpress_python)
    if args.half != "ours" and not peer.is_file():
        print(f"kvpress-compare: {peer} not found; build the peer with `make peer-kvpress` "
              "(or pass --half ours)", file=sys.stderr)
        return 2
    budgets = ([Budget(ratio=r) for r in args.budget_ratios]
               + [Budget(tokens=t) for t in args.budget_tokens])
    if not budgets:
        print("kvpress-compare: give at least one --budget-ratios or --budget-tokens value",
              file=sys.stderr)
        return 2
    p = MethodParams(args.sink_tokens, args.window_size, args.kernel_size, args.beta)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    from workbench.config.named_models import resolve_model
    from workbench.models.tokenizer import load_tokenizer

    model_dir = resolve_model(args.model)
    cases_path = Path(args.cases) if args.cases else out_dir / "cases.jsonl"
    if not args.cases:
        grid_args = [*(["--lengths", *args.lengths] if args.lengths else []),
                     *(["--depths", *args.depths] if args.depths else []),
                     *(["--cases-per-cell", args.cases_per_cell] if args.cases_per_cell
                       else [])]
        export_cases(args.model, cases_path, grid_args)
    cases = read_cases(cases_path)[: args.limit]
    tok = load_tokenizer(model_dir)
    hf_config = json.loads((Path(model_dir) / "config.json").read_text())
    num_layers = int(hf_config["num_hidden_layers"])
    max_model_len = int(hf_config["max_position_embeddings"])  # our engine's default

    def tokenize(text: str) -> list[int]:
        return list(tok(text)["input_ids"])

    ids = [tokenize(c.prompt) for c in cases]
    if any(len(t) != c.context_tokens for c, t in zip(cases, ids, strict=True)):
        print("kvpress-compare: the tokenizer does not give each case its context_tokens ids "
              "(is --model the model the cases were exported for?)", file=sys.stderr)
        return 2
    from workbench.testing.needle_cases import QUESTION

    starts = ([question_start(c, t, tokenize, QUESTION) for c, t in zip(cases, ids, strict=True)]
              if args.split == "question" else None)
    eos = [int(tok.eos_token_id)] if tok.eos_token_id is not None else []
    cells = grid(args.methods, budgets)
    outcomes: list[Outcome] = []
    notes: list[str] = [f"machine: {machine_line()}", f"cases: {cases_path} ({len(cases)})",
                        f"split: {args.split}", f"method knobs: {p}"]

    def add(side: str, method: str, label: str, case: NeedleCase, out_ids: list[int]) -> None:
        text = tok.decode(out_ids, skip_special_tokens=True)
        outcomes.append(Outcome(side, method, label, case, strip_eos(out_ids, eos),
                                is_correct(case.answer, text)))

    if args.half in ("both", "kvpress"):
        jobs = kvpress_jobs(cases, ids, cells, p, eos, starts, num_layers, max_model_len)
        t0 = time.perf_counter()
        results, meta = run_kvpress(jobs, model_dir, peer, out_dir, args.timeout_s)
        notes.append(f"kvpress side: {meta['versions']}, {len(jobs)} jobs in "
                     f"{time.perf_counter() - t0:.0f} s")
        if args.split == "whole":
            exact = sum(abs(meta["mean_kv_tokens"][j["job_id"]] - expected_kept(j)) < 1
                        for j in jobs)
            notes.append(f"kvpress kept the mapped KV (within 1 token, mean over layers) in "
                         f"{exact} of {len(jobs)} runs")
        for method, budget in cells:
            label = budget.label if budget else "full"
            for case in cases:
                add("kvpress", method, label, case,
                    results[f"{method}|{label}|{case.case_id}"])
    if args.half in ("both", "ours"):
        t0 = time.perf_counter()
        ours = run_ours(cases, ids, cells, args.model, p)
        notes.append(f"ours: {len(ours)} of {len(cells)} engines ran, in "
                     f"{time.perf_counter() - t0:.0f} s")
        with (out_dir / "ours_results.jsonl").open("w") as fh:
            for (method, label), per_case in ours.items():
                for case, out_ids in zip(cases, per_case, strict=True):
                    fh.write(json.dumps({"method": method, "budget": label,
                                         "case_id": case.case_id,
                                         "output_token_ids": out_ids}) + "\n")
        for (method, label), per_case in ours.items():
            for case, out_ids in zip(cases, per_case, strict=True):
                add("ours", method, label, case, out_ids)

    rows = accuracy_rows(outcomes)
    write_accuracy_csv(rows, out_dir / "accuracy.csv")
    lengths = [len(t) for t in ids]
    md = "\n\n".join([
        "# Needle accuracy: our eviction policies vs kvpress", "\n".join(
            f"- {n}" for n in notes),
        "## Side by side\n\n" + comparison_table(outcomes, cells),
        "## Budget mapping (per distinct prompt length)\n\n" + mapping_table(
            lengths, budgets, args.methods, p, num_layers),
        "## Accuracy by context length\n\n" + length_table(rows)])
    (out_dir / "comparison.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
