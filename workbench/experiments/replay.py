"""What every run of a template replays: the tokenizer's folder, the seeded workload, the
arrivals and the SLO (`run_experiment`, `workbench rerun`, a cluster node's run).

    replay_setup(template)   -> Replay(model, workload, arrival, slo)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from workbench.config.named_models import resolve_model as folder_of
from workbench.errors import UserError
from workbench.experiments.template import Template
from workbench.experiments.validate import check_template
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import SLO
from workbench.harness.traces import load_trace_spec
from workbench.harness.workloads import load_jsonl, make_workload
from workbench.models.tokenizer import load_tokenizer


class Replay(NamedTuple):
    """(model folder, workload, ArrivalSpec, SLO); a rate sweep's arrival is None (each point
    has its own)."""

    model: str
    workload: Any
    arrival: Any
    slo: Any


def resolve_model(target: dict[str, Any]) -> str:
    """The local folder whose tokenizer builds the workload (http targets: `tokenizer`; a
    simulated target of a named shape: the bundled tokenizer, `sim.target.tokenizer_name`)."""
    if target.get("kind") == "simulated":
        from workbench.sim.target import tokenizer_name

        return folder_of(tokenizer_name(target))
    return folder_of(str(target.get("tokenizer", target.get("model", "bundled"))))


def build_workload(template: Template, model: str) -> Any:
    tok = load_tokenizer(model)
    w = template.workload
    if "jsonl" in w:
        return load_jsonl(w["jsonl"], tokenizer=tok, name=w.get("name"))
    if "trace" in w:
        return load_trace_spec(w, tok)
    return make_workload(w["fixture"], int(w.get("seed", 0)), tok, **(w.get("params") or {}))


def replay_setup(template: Template, check: bool = True, sweep: bool = False) -> Replay:
    """What every run of the template replays. `check`: the whole template is checked first
    (`validate.check_template`, every problem at once, `TemplateError`). A rate-sweep
    template (each point has its own arrivals, `RateSweep.arrival`) gives ArrivalSpec None
    and its SLO when the caller runs sweeps (`sweep=True`), else a `UserError`."""
    if template.rate_sweep is not None and not sweep:
        raise UserError(f"template {template.name!r} is a rate sweep (rate_sweep): rerunning "
                        "its runs is not supported; run the template again")
    model = resolve_model(template.target)
    if check:  # every problem of the template at once, before the first run
        workload = check_template(template.as_data(), source=f"template {template.name!r}")
    else:
        workload = build_workload(template, model)
    if template.rate_sweep is not None:
        return Replay(model, workload, None, template.rate_sweep.slo.as_slo())
    slo = SLO(ttft_ms=template.slo.get("p95_ttft_ms"), tpot_ms=template.slo.get("p95_tpot_ms"),
              e2el_ms=template.slo.get("p95_e2el_ms"))
    return Replay(model, workload, ArrivalSpec.from_dict(template.arrivals), slo)
