"""planning.pd_ratio's answers beside what notebook 12 measured.

    calc_vs_measured(ratio, goodputs)  per measured layout: the split's (or colocated) rate,
                                       the goodput, measured / calc, the bottleneck, the best
                                       split and the balanced P:M
    split_measured(goodputs)           layout names ("colocated x2", "1P:1D") -> the keys
                                       `analysis.disagg.pd_ratio_plot` takes
    capacity_row(shape, capacity)      one shape's measured prefill / decode capacity
                                       (`harness.pd_capacity.PDCapacity`) and planning's
                                       answers for it

The goodputs come from `analysis.disagg_runs`; the capacity from
`workbench.experiments.studies.pd_disaggregation.measure_capacity`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench import planning
from workbench.planning import PDRatio


def calc_vs_measured(ratio: PDRatio, measured: Mapping[str, float]) -> pd.DataFrame:
    """One row per layout in `measured` ({layout_name: goodput req/s}): calc's sustainable
    rate for it (colocated: `colocated_rate`; "PP:MD": that split's system rate), the
    measured goodput, measured / calc, and calc's bottleneck; then calc's best split and
    balanced P:M ratio (d / p) as the last columns of every row."""
    splits = {f"{s.prefill_instances}P:{s.decode_instances}D": s for s in ratio.splits}
    rows = []
    for layout, goodput in measured.items():
        if layout.startswith("colocated"):
            rate, bottleneck = ratio.colocated_rate, "both phases"
        elif layout in splits:
            rate, bottleneck = splits[layout].system_rate, splits[layout].bottleneck
        else:
            raise ValueError(f"measured layout {layout!r} is neither colocated nor one of "
                             f"{list(splits)}")
        rows.append({"layout": layout, "calc_rate": rate, "measured_goodput": float(goodput),
                     "measured_over_calc": float(goodput) / rate, "calc_bottleneck": bottleneck,
                     "calc_best_split": ratio.best.label,
                     "calc_balanced_p_over_m": ratio.balanced_ratio})
    return pd.DataFrame(rows)


def split_measured(measured: Mapping[str, float]) -> dict[str, float]:
    """{layout_name: goodput} -> the keys `analysis.disagg.pd_ratio_plot` takes ("P:M",
    "colocated")."""
    out = {}
    for layout, v in measured.items():
        if layout.startswith("colocated"):
            out["colocated"] = float(v)
        else:
            m = re.fullmatch(r"(\d+)P:(\d+)D", layout)
            if m is None:
                raise ValueError(f"layout {layout!r} is neither colocated nor 'PP:MD'")
            out[f"{m.group(1)}:{m.group(2)}"] = float(v)
    return out


def capacity_row(shape: str, capacity: Any, wider: int = 8) -> dict[str, Any]:
    """One shape's capacity figures and planning's answers: tok/s per phase, requests/s per
    prefill (p) and decode (d) instance, the balanced P:M = d / p, the best split of
    `wider` instances, and the 1:1 and colocated rates of the measured 2 instances."""
    r = capacity.ratio
    c = capacity.config
    wide = planning.pd_ratio(wider, c.input_len, c.output_len, r.prefill_tok_s, r.decode_tok_s)
    return {"shape": shape, "input_len": c.input_len, "output_len": c.output_len,
            "prefill_tok_s": r.prefill_tok_s, "decode_tok_s": r.decode_tok_s,
            "prefill_req_s": r.prefill_rate_per_instance,
            "decode_req_s": r.decode_rate_per_instance, "balanced_p_over_m": r.balanced_ratio,
            f"best_split_of_{wider}": wide.best.label, "calc_1p1d": r.best.system_rate,
            "calc_colocated": r.colocated_rate, "valid": capacity.valid}
