"""Runs from different hardware do not compare: the rule the verdict and the cluster obey.

A run carries the `workbench preflight` fingerprint of the node it ran on (RunRecord
.fingerprint, MLflow tag hardware_fingerprint). Before any run, `mixed_nodes` refuses a
cluster whose nodes differ; after the runs, `mixed_runs` gives the reason an experiment has
no verdict when its runs came from more than one fingerprint. `--allow-mixed-hardware`
(ExecutorConfig.allow_mixed_hardware) lets both through.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

ALLOW_FLAG = "--allow-mixed-hardware"


def _groups(pairs: Iterable[tuple[str | None, str | None]]) -> dict[str, list[str]]:
    """{fingerprint: sorted node names} from (fingerprint, node) pairs; None fingerprints
    (a run that never measured) are left out."""
    out: dict[str, set[str]] = {}
    for fp, node in pairs:
        if fp:
            out.setdefault(fp, set()).add(node or "?")
    return {fp: sorted(nodes) for fp, nodes in sorted(out.items())}


def _listing(groups: dict[str, list[str]]) -> str:
    return "; ".join(f"{fp} on {', '.join(nodes)}" for fp, nodes in groups.items())


def mixed_runs(runs: Sequence[Any]) -> str | None:
    """The one-line reason there is no verdict when the measured runs (RunRecords without
    an error) carry more than one fingerprint; None when they all agree."""
    groups = _groups((r.fingerprint, r.node) for r in runs if r.error is None)
    if len(groups) < 2:
        return None
    return (f"no verdict: the runs were measured on different hardware/software "
            f"(fingerprint {_listing(groups)}), so their numbers do not compare; run on "
            f"nodes of one kind, or pass {ALLOW_FLAG} to compare them anyway")


def mixed_nodes(probes: Sequence[dict[str, Any]]) -> str | None:
    """The one-line refusal, before any run, of a cluster whose nodes' fingerprints differ
    (probes: `executors.node.probe_node()` per node), naming the fields that differ."""
    groups = _groups((p["fingerprint"], p["node"]) for p in probes)
    if len(groups) < 2:
        return None
    from workbench.platforms.preflight import compare_fingerprints

    first = {p["fingerprint"]: p["preflight"] for p in probes}
    a, b = list(groups)[:2]
    fields = "; ".join(w.split("; the runs are")[0]
                       for w in compare_fingerprints(first[a], first[b])[:2])
    return (f"the Ray cluster's nodes differ in hardware/software (fingerprint "
            f"{_listing(groups)}; {fields}): runs on them would not compare. Offer the "
            f"workbench_node resource only on nodes of one kind, or pass {ALLOW_FLAG}")


def common_fingerprint(probes: Sequence[dict[str, Any]]) -> str:
    """The fingerprint the nodes share, else 'mixed:<a>,<b>,...' (the parent run's tag)."""
    fps = sorted({str(p["fingerprint"]) for p in probes})
    return fps[0] if len(fps) == 1 else "mixed:" + ",".join(fps)
