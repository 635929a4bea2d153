"""The step's overhead account as a notebook table and a per-step stacked bar plot.

Reads step-trace rows (`LLM.step_trace()`, `RunResult.step_trace`) whose phase fields the
engine fills (`workbench.metrics.step_account.STEP_PHASES`, docs/step_account.md):

    step_account_table(rows)       phase | ms per step | share of step time (+ the step row)
    step_account_bars(rows)        one stacked bar per step, ms per phase, forward at the bottom
    account_beside_latency(rows, metrics)   one row: TTFT/TPOT beside step ms and overhead share

When everything but the forward dominates a step (overhead share near 1), a measured
difference between two configurations is mostly Python and dispatch overhead, not the
technique the configurations differ in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from workbench.analysis.plots import _figure, _legend, _skip
from workbench.metrics.step_account import STEP_PHASES, overhead_account

# forward first (the bottom of every bar), then the overheads in step order
_BAR_ORDER = ("forward",) + tuple(p for p in STEP_PHASES if p != "forward")
_COLORS = {"forward": "tab:blue", "schedule": "tab:orange", "prepare_inputs": "tab:green",
           "sample": "tab:red", "update": "tab:purple", "spec_propose": "tab:brown",
           "other": "tab:gray"}


def step_account_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per phase (STEP_PHASES order): mean ms per step and share of the step time,
    then "step" (the whole step) and "overhead" (everything but the forward)."""
    acc = overhead_account(rows)
    out = [{"phase": p, "ms_per_step": acc[p + "_ms"], "share": acc[p + "_share"]}
           for p in STEP_PHASES]
    out.append({"phase": "step", "ms_per_step": acc["step_ms"],
                "share": 1.0 if acc["step_ms"] else 0.0})
    out.append({"phase": "overhead (step - forward)",
                "ms_per_step": acc["step_ms"] - acc["forward_ms"],
                "share": acc["overhead_share"]})
    return pd.DataFrame(out)


def account_beside_latency(rows: Sequence[Mapping[str, Any]],
                           metrics: Mapping[str, Any]) -> pd.DataFrame:
    """One row: the run's median TTFT and TPOT (ms; harness metric names) beside its mean
    step, forward and overhead (ms per step) and the overhead share."""
    acc = overhead_account(rows)
    return pd.DataFrame([{
        "median_ttft_ms": metrics.get("median_ttft_ms"),
        "median_tpot_ms": metrics.get("median_tpot_ms"),
        "steps": acc["num_steps"], "step_ms": acc["step_ms"], "forward_ms": acc["forward_ms"],
        "overhead_ms": acc["step_ms"] - acc["forward_ms"],
        "overhead_share": acc["overhead_share"],
    }])


def step_account_bars(rows: Sequence[Mapping[str, Any]] | pd.DataFrame,
                      *, title: str | None = None) -> Figure | None:
    """Stacked bars per engine step: top, ms in each phase with the forward at the bottom (the
    height above the blue is the step's overhead); below, the overheads as shares of their
    step (the bar's height is the step's overhead share). None when no row carries it."""
    trace = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if trace.empty or "forward_s" not in trace.columns:
        _skip("step_account_bars", "no step-trace rows with the overhead account")
        return None
    fig, (ax, ax_share) = _figure(1, nrows=2, width=7.0, height=2.4, sharex=True)
    x = list(range(len(trace)))
    step = trace["duration_s"].astype(float)
    bottom = pd.Series(0.0, index=trace.index)
    share_bottom = pd.Series(0.0, index=trace.index)
    for phase in _BAR_ORDER:
        seconds = trace[phase + "_s"].astype(float)
        if not (seconds > 0).any():
            continue  # e.g. spec_propose without speculation: no empty legend entry
        ax.bar(x, 1e3 * seconds, bottom=bottom, width=1.0, label=phase,
               color=_COLORS[phase], linewidth=0)
        bottom = bottom + 1e3 * seconds
        if phase != "forward":
            share = (seconds / step.where(step > 0)).fillna(0.0)
            ax_share.bar(x, share, bottom=share_bottom, width=1.0, color=_COLORS[phase],
                         linewidth=0)
            share_bottom = share_bottom + share
    ax.set_ylabel("ms")
    ax_share.set_ylabel("share of the step")
    ax_share.set_ylim(0, 1)
    ax_share.set_xlabel("engine step (in order)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    share = overhead_account(trace.to_dict("records"))["overhead_share"]
    fig.suptitle(title or f"where each step's time goes ({len(trace)} steps, "
                          f"overhead share {share:.0%})")
    return fig
