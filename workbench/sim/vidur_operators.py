"""Operator by operator: our analytic GEMM times next to the times Vidur profiled on the GPU
(its `data/profiling/compute/<device>/<model>/mlp.csv`, one row per token count, each
operator's median in milliseconds over its profiling runs).

    theirs = vidur_operator_ms(Path(".../mlp.csv").read_text(), shape, [1, 512, 4096])
    ours = our_operator_ms(AnalyticCostModel(shape, "A100-80GB-SXM"), [1, 512, 4096])
    print(operator_table(ours, theirs))

The four GEMMs of a layer map one to one (Vidur's name -> ours): attn_pre_proj -> qkv_proj,
attn_post_proj -> o_proj, mlp_up_proj -> gate_up_proj, mlp_down_proj -> down_proj. Vidur
also times what our model leaves out (UNMODELLED: the norms, rotary, the activation, the
residual add); their sum is shown as one row with nothing on our side. Per layer, one
sequence of `num_tokens` tokens, tensor parallel degree 1.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence

from workbench.sim.batch import BatchComposition
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.model_shapes import ModelShape

GEMMS = (("qkv_proj", "attn_pre_proj"), ("o_proj", "attn_post_proj"),
         ("gate_up_proj", "mlp_up_proj"), ("down_proj", "mlp_down_proj"))
UNMODELLED = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
ELEMENTWISE = "elementwise (not modelled)"


def vidur_operator_ms(text: str, shape: ModelShape, num_tokens: Sequence[int],
                      tensor_parallel_size: int = 1) -> dict[int, dict[str, float]]:
    """Per token count, Vidur's per-layer time of each GEMM (our names) and ELEMENTWISE, in
    ms, from an mlp.csv's text; rows of other shapes are skipped, duplicate rows of one
    token count give the median of their medians. A count with no row is a ValueError."""
    reader = csv.DictReader(io.StringIO(text))
    shape_cols = {"n_head": shape.num_heads, "n_kv_head": shape.num_kv_heads,
                  "n_embd": shape.hidden_size, "n_expanded_embd": shape.intermediate_size,
                  "num_tensor_parallel_workers": tensor_parallel_size}
    ops = [v for _, v in GEMMS] + list(UNMODELLED)
    need = [*shape_cols, "num_tokens", *(f"time_stats.{op}.median" for op in ops)]
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"Vidur mlp.csv lacks column(s) {', '.join(missing)}")
    wanted = set(num_tokens)
    rows: dict[int, list[dict[str, str]]] = {}
    for row in reader:
        if all(_int(row[c]) == v for c, v in shape_cols.items()):
            n = _int(row["num_tokens"])
            if n in wanted:
                rows.setdefault(n, []).append(row)
    absent = sorted(wanted - set(rows))
    if absent:
        raise ValueError(f"Vidur mlp.csv has no row for {shape.name} at num_tokens "
                         f"{absent} (tensor parallel {tensor_parallel_size})")
    out: dict[int, dict[str, float]] = {}
    for n in num_tokens:
        med = {op: statistics.median(float(r[f"time_stats.{op}.median"] or 0.0)
                                     for r in rows[n]) for op in ops}
        out[n] = {ours: med[theirs] for ours, theirs in GEMMS}
        out[n][ELEMENTWISE] = sum(med[op] for op in UNMODELLED)
    return out


def _int(value: str) -> int | None:
    try:
        return int(float(value))
    except ValueError:
        return None


def our_operator_ms(cost: AnalyticCostModel, num_tokens: Sequence[int]
                    ) -> dict[int, dict[str, float]]:
    """Per token count, our per-layer time of each GEMM in ms (one prefill of n tokens)."""
    layers = cost.shape.num_layers
    out = {}
    for n in num_tokens:
        parts = cost.breakdown(BatchComposition(prefill_tokens=n, num_seqs=1))
        out[n] = {op: parts[op] / layers * 1e3 for op, _ in GEMMS}
    return out


def operator_table(ours: dict[int, dict[str, float]], theirs: dict[int, dict[str, float]]
                   ) -> str:
    """Markdown: per token count and operator, ours, Vidur's profiled, ours / Vidur."""
    lines = ["| tokens | operator | ours (ms) | Vidur profiled (ms) | ours / Vidur |",
             "|---:|---|---:|---:|---:|"]
    for n in sorted(theirs):
        for op in [*(o for o, _ in GEMMS), ELEMENTWISE]:
            b = theirs[n][op]
            a = ours.get(n, {}).get(op)
            mine = "-" if a is None else f"{a:.4f}"
            ratio = f"{a / b:.2f}" if a is not None and b > 0 else "-"
            lines.append(f"| {n} | {op} | {mine} | {b:.4f} | {ratio} |")
    return "\n".join(lines)
