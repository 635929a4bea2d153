"""The real engine replayed on a virtual clock: the simulator's yardstick without wall time.

`replay_engine(engine, workload, arrival, cost)` sends `workload` to a real `LLMEngine` (a
model, real tokens, the real scheduler, prefix cache and speculation) at the arrival
process's times, but time is virtual: each `engine.step()` advances the clock by
`cost.step_time_s` of the composition the engine recorded for that step (its step-trace
row; workbench/core/batch_composition.py). A request is sent at its arrival time (or when a
slot frees under a concurrency cap) and joins the engine at the next step boundary, as in a
served engine; tokens, first tokens and finishes are stamped at the step's end, as the
simulator stamps them. So a run is a deterministic function of the
engine's own decisions and the cost model, and comparing it with `simulate()` under the same
cost model measures what the simulator's replica of the engine gets wrong (scheduling,
chunking, caching, speculation, arrivals, metrics), apart from how well the cost model
prices a step (that is the calibration's held-out error and the measured fidelity table in
docs/simulator.md). tests/sim/test_fidelity_virtual.py holds the simulator to issue 33's
targets this way, with no wall clock.

Open-loop (poisson/gamma/constant/trace) and closed-loop arrivals; follow-up requests
(`follows`) are refused. Requests are greedy with ignore_eos, like the simulator's.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.harness.metrics import RequestRecord
from workbench.harness.workloads import Workload
from workbench.sim.batch import CostModel
from workbench.sim.calibrate_serving import composition_of
from workbench.sim.simulator import SimResult, finish_record


def replay_engine(engine: Any, workload: Workload, arrival: ArrivalSpec,
                  cost: CostModel) -> SimResult:
    """Run `workload` on `engine` (an idle LLMEngine) on a virtual clock priced by `cost`."""
    from workbench.sampling_params import SamplingParams

    reqs = list(workload.requests)
    if any(r.follows is not None for r in reqs):
        raise ValueError("replay_engine: follow-up requests (follows) are not supported")
    if engine.has_unfinished_requests():
        raise ValueError("replay_engine needs an idle engine")
    offsets = arrival_offsets(arrival, len(reqs), [r.arrival_s for r in reqs])
    if offsets is None:
        cap: float = arrival.concurrency or 1
        due = [(0.0, i) for i in range(len(reqs))]
    else:
        cap = arrival.max_concurrency or math.inf
        due = [(t, i) for i, t in enumerate(offsets)]
    heapq.heapify(due)
    records: dict[str, RequestRecord] = {}
    live: dict[str, Any] = {}
    seen: dict[str, int] = {}
    trace: list[dict[str, Any]] = []
    now = 0.0
    freed = 0.0  # when the in-flight count last dropped below the cap
    while due or live:
        while due and due[0][0] <= now and len(live) < cap:
            t, i = heapq.heappop(due)
            br = reqs[i]
            params = SamplingParams(temperature=0.0, max_tokens=br.max_tokens, ignore_eos=True)
            req = engine.make_request(list(br.prompt_token_ids), params,
                                      request_id=br.request_id)
            engine.add_request(req)
            records[br.request_id] = RequestRecord(
                request_id=br.request_id, prompt_tokens=len(br.prompt_token_ids),
                output_tokens=0, success=False,
                target_arrival_s=t if offsets is not None else None, start_s=max(t, freed))
            live[br.request_id], seen[br.request_id] = req, 0
        if not live:
            now = max(now, due[0][0])
            continue
        engine.step()
        row = engine.stats.step_trace[-1].as_dict()
        dt = cost.step_time_s(composition_of(row))
        trace.append({**row, "start_s": now, "step_s": dt, "duration_s": dt})
        now += dt
        for rid in list(live):
            req = live[rid]
            n = len(req.output_token_ids) - seen[rid]
            rec = records[rid]
            if n > 0:
                seen[rid] += n
                rec.chunk_times_s.append(now)
                rec.chunk_tokens.append(n)
                if rec.first_token_s is None:
                    rec.first_token_s = now
            if req.is_finished():
                finish_record(rec, req, now)
                if len(live) >= cap:
                    freed = now  # the next request waiting for a slot is sent now
                del live[rid]
    out = [records[r.request_id] for r in reqs if r.request_id in records]
    return SimResult(out, max(now, 1e-9), trace)
