"""The discrete-event loop: a workload's requests arrive on a virtual clock, a router sends
each to one of N `SimInstance`s, every instance steps its real scheduler, and each request's
timeline comes back as the harness's `RequestRecord` (so TTFT/TPOT/ITL/E2E, goodput, the
verdict, MLflow and the plots work unchanged).

    result = simulate(workload, arrival, instances, policy="round_robin")
    result = simulate(workload, arrival, prefill_instances, "prefix_aware",
                      decode_instances=decode_instances, kv_link=KVLink(50e9))
    result.metrics(slo=...)        # harness.metrics.compute_metrics over the records

Routing: `policy` is one of the real router's policies (`sim/router.py`: round_robin,
least_outstanding, prefix_aware keyed on the first `prefix_blocks` full blocks).
Disaggregated (`decode_instances` given): `instances` are prefill instances; a request's
prefill leg (max_tokens 1) runs on one of them, then its decode leg on the decode instance
`decode_policy` picks, reading the prompt's KV over the prefill instance's link (`kv_link`;
`sim/pd.py` has the handshake and what TTFT means there).

When requests are sent follows the harness exactly: `harness.arrivals.arrival_offsets` for an
open loop (the same seeded schedule a measured run replays), `concurrency` requests in flight
for a closed loop, `max_concurrency` as a cap, and a follow-up turn (`follows`, `think_s`)
sent `think_s` after the request it follows finished. Deterministic: no wall clock, no
randomness but the seeded arrival schedule and the instances' seeded draws. Ties on the
clock resolve in a fixed order: steps that end are applied first (instances in order), then
KV loads that end on idle instances, then the requests due are sent, then every idle instance
with work starts a step.

A request no instance can ever schedule (its prompt needs more KV blocks than the pool has)
ends failed with the reason, as the engine refuses it; the rest go on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.core.request import Request, RequestStatus
from workbench.distributed.kv_transfer.metadata import KVConnectorOutput, KVConnectorStats
from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.harness.metrics import RequestRecord, compute_metrics
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sampling_params import SamplingParams
from workbench.sim.connectors import Load
from workbench.sim.instance import SimInstance, StepResult
from workbench.sim.pd import ConsumerConnector, ProducerConnector
from workbench.sim.router import POLICIES, SimRouter
from workbench.sim.transfer import KVLink, LinkQueue

__all__ = ["POLICIES", "SimResult", "simulate"]


@dataclass
class SimResult:
    """One simulated run: the records (harness format), the virtual duration and the steps;
    `decisions`: the routers' reasons counted; `legs`: per disaggregated request, the
    prefill leg's end and its KV transfer (seconds on the wire, bytes)."""

    records: list[RequestRecord]
    duration_s: float
    step_trace: list[dict[str, Any]] = field(default_factory=list)
    instances: dict[str, dict[str, float]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # vLLM's names, all instances
    decisions: dict[str, dict[str, int]] = field(default_factory=dict)
    legs: dict[str, dict[str, float]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # instance -> colocated|prefill|decode
    placement: dict[str, list[str]] = field(default_factory=dict)  # request -> instance(s)

    def metrics(self, **kw: Any) -> dict[str, float]:
        return compute_metrics(self.records, self.duration_s, **kw)


def simulate(workload: Workload, arrival: ArrivalSpec, instances: Sequence[SimInstance],
             policy: str = "round_robin", *, prefix_blocks: int = 4,
             decode_instances: Sequence[SimInstance] = (),
             decode_policy: str = "least_outstanding",
             kv_link: KVLink | None = None, keep_step_trace: bool = True) -> SimResult:
    """Run `workload` under `arrival` on `instances` (see the module docstring).
    `keep_step_trace=False`: no per-step rows in the result (a long run's memory is almost
    all its step trace: ~0.8 KiB a step)."""
    if not instances:
        raise ValueError("simulate needs at least one SimInstance")
    if decode_instances:
        if kv_link is None:
            raise ValueError("simulate: decode_instances need kv_link (the link the prompt's "
                             "KV crosses from a prefill instance)")
        for inst in instances:
            if not isinstance(inst.connector, ProducerConnector):
                raise ValueError(f"simulate: prefill instance {inst.name} needs a "
                                 "ProducerConnector")
        for inst in decode_instances:
            if not isinstance(inst.connector, ConsumerConnector):
                raise ValueError(f"simulate: decode instance {inst.name} needs a "
                                 "ConsumerConnector")
    return _Run(workload, arrival, list(instances), policy, prefix_blocks,
                list(decode_instances), decode_policy, kv_link, keep_step_trace).run()


class _Run:
    def __init__(self, workload: Workload, arrival: ArrivalSpec, front: list[SimInstance],
                 policy: str, prefix_blocks: int, back: list[SimInstance],
                 decode_policy: str, kv_link: KVLink | None,
                 keep_step_trace: bool = True) -> None:
        self.keep_step_trace = keep_step_trace
        self.front, self.back, self.all = front, back, front + back
        bs = front[0].scheduler.kv_cache_manager.block_size
        self.router = SimRouter(front, policy, block_size=bs, prefix_blocks=prefix_blocks)
        self.decode_router = SimRouter(back, decode_policy, block_size=bs) if back else None
        self.links = [LinkQueue(kv_link) for _ in front] if back and kv_link else []
        self.arrival = arrival
        self.reqs = list(workload.requests)
        self.by_id = {r.request_id: r for r in self.reqs}
        self.order = {r.request_id: i for i, r in enumerate(self.reqs)}
        self.followers: dict[str, list[BenchRequest]] = {}
        for r in self.reqs:
            if r.follows is not None:
                if r.follows not in self.by_id:
                    raise ValueError(f"request {r.request_id!r} follows {r.follows!r}, which "
                                     "is not in the workload")
                self.followers.setdefault(r.follows, []).append(r)
        self.records: dict[str, RequestRecord] = {}
        self.live: dict[str, Request] = {}
        self.legs: dict[str, dict[str, float]] = {}
        self.placement: dict[str, list[str]] = {}
        self.due: list[tuple[float, int, BenchRequest]] = []
        self.ends: list[tuple[float, int]] = []  # (step end time, instance index)
        self.trace: list[dict[str, Any]] = []
        self.in_flight = 0
        self.now = 0.0

    def run(self) -> SimResult:
        heads = [r for r in self.reqs if r.follows is None]
        arrival = self.arrival
        offsets = arrival_offsets(arrival, len(heads), [r.arrival_s for r in heads])
        if arrival.mode == "closed":
            cap: float = arrival.concurrency or 1
            due0 = [0.0] * len(heads)
        else:
            cap = arrival.max_concurrency or math.inf
            assert offsets is not None
            due0 = offsets
        # follow-ups carry no target arrival (the harness judges the first turns' schedule)
        scheduled = {r.request_id: t for t, r in zip(due0, heads, strict=True)}
        self.due = [(t, self.order[r.request_id], r) for t, r in zip(due0, heads, strict=True)]
        heapq.heapify(self.due)
        insts = self.all
        while self.due or self.ends or any(i.has_work() for i in insts):
            candidates = [t for i in insts if not i.busy and (t := i.next_load_s()) is not None]
            if self.ends:
                candidates.append(self.ends[0][0])
            if self.due and self.in_flight < cap:
                candidates.append(self.due[0][0])
            if not candidates:  # work left, nothing running, nothing to send: stuck requests
                self.in_flight -= _fail_stuck(insts, self.live, self.records, self.now)
                continue
            self.now = now = max(self.now, min(candidates))
            while self.ends and self.ends[0][0] <= now:
                _, k = heapq.heappop(self.ends)
                self._step_done(k, insts[k].finish_step())
            for inst in insts:
                self._loads_done(inst.complete_loads(now))
            while self.due and self.due[0][0] <= now and self.in_flight < cap:
                self._send(heapq.heappop(self.due)[2], scheduled.get)
            for k, inst in enumerate(insts):
                if not inst.busy and inst.has_work():
                    end = inst.start_step(now)
                    if end is not None:
                        heapq.heappush(self.ends, (end, k))
        return self._result()

    def _send(self, br: BenchRequest, target_of: Callable[[str], float | None]) -> None:
        now = self.now
        max_tokens = 1 if self.back else br.max_tokens  # a prefill leg: one token
        req = Request(br.request_id, br.prompt_token_ids,
                      SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                      arrival_time=now)
        self.records[br.request_id] = RequestRecord(
            request_id=br.request_id, prompt_tokens=len(br.prompt_token_ids),
            output_tokens=0, success=False, target_arrival_s=target_of(br.request_id),
            start_s=now)
        self.live[br.request_id] = req
        self.in_flight += 1
        inst = self.front[self.router.pick(req)]
        self.placement[br.request_id] = [inst.name]
        inst.add(req)

    def _step_done(self, k: int, step: StepResult) -> None:
        now = self.now
        if self.keep_step_trace:
            self.trace.append(step.row)
        prefill_leg = bool(self.back) and k < len(self.front)
        if not prefill_leg:  # a prefill leg's token is not streamed to the client
            for rid, n in step.tokens.items():
                rec = self.records[rid]
                rec.chunk_times_s.append(now)
                rec.chunk_tokens.append(n)
                if rec.first_token_s is None:
                    rec.first_token_s = now
        for req in step.finished:
            if prefill_leg and req.status == RequestStatus.FINISHED_LENGTH_CAPPED:
                self._decode_leg(k, req)
            else:
                self._finish(req)
        self._loads_done(step.loads)

    def _decode_leg(self, k: int, prefill: Request) -> None:
        """The prefill leg ended: the decode leg goes to a decode instance, its KV from `k`."""
        assert self.decode_router is not None
        rid, now = prefill.request_id, self.now
        br = self.by_id[rid]
        req = Request(rid, br.prompt_token_ids,
                      SamplingParams(temperature=0.0, max_tokens=br.max_tokens,
                                     ignore_eos=True), arrival_time=now)
        self.legs[rid] = {"prefill_end_s": now, "prefill_instance": float(k)}
        inst = self.back[self.decode_router.pick(req)]
        self.placement[rid].append(inst.name)
        assert isinstance(inst.connector, ConsumerConnector)
        inst.connector.expect(rid, k, self.links[k])
        self.live[rid] = req
        inst.add(req)

    def _loads_done(self, loads: list[Load]) -> None:
        for load in loads:
            if load.source is None:
                continue  # the instance's own tier: its connector counts it
            rid, rec = load.request_id, self.records[load.request_id]
            wire = load.done_s - load.start_s
            rec.server_kv_transfer_s, rec.server_kv_wait_s = wire, load.done_s - load.asked_s
            rec.server_kv_transfer_bytes = float(load.num_bytes)
            leg = self.legs.setdefault(rid, {})
            leg |= {"kv_transfer_s": wire, "kv_bytes": float(load.num_bytes),
                    "kv_done_s": load.done_s}
            stats = KVConnectorStats(sends=1, send_bytes=load.num_bytes, send_time_s=wire,
                                     send_wait_s=load.done_s - leg.get("prefill_end_s", 0.0))
            self.all[load.source].post(KVConnectorOutput(finished_sending={rid}, stats=stats))

    def _finish(self, req: Request) -> None:
        rid, now = req.request_id, self.now
        finish_record(self.records[rid], req, now)
        self.live.pop(rid, None)
        self.in_flight -= 1
        for nxt in self.followers.get(rid, ()):
            heapq.heappush(self.due, (now + nxt.think_s, self.order[nxt.request_id], nxt))

    def _result(self) -> SimResult:
        out = [self.records[r.request_id] for r in self.reqs if r.request_id in self.records]
        duration = max([self.now, *[r.end_s for r in out if r.end_s is not None]]) or 1e-9
        roles = {i.name: "prefill" if self.back else "colocated" for i in self.front}
        roles |= {i.name: "decode" for i in self.back}
        stats = {i.name: {"steps": float(i.steps), "busy_s": i.busy_s,
                          "utilization": i.busy_s / duration} for i in self.all}
        counters: dict[str, float] = {}
        for inst in self.all:
            for key, value in inst.counters.items():
                counters[key] = counters.get(key, 0.0) + value
        decisions = {"router": dict(self.router.decisions)}
        if self.decode_router is not None:
            decisions["decode_router"] = dict(self.decode_router.decisions)
        return SimResult(out, duration, self.trace, stats, counters, decisions, self.legs,
                         roles, self.placement)


def finish_record(rec: RequestRecord, req: Request, now: float) -> None:
    """A finished request's record: end, output tokens, success, cached tokens, engine times."""
    rec.end_s = now
    rec.output_tokens = len(req.output_token_ids)
    rec.success = req.status in (RequestStatus.FINISHED_STOPPED,
                                 RequestStatus.FINISHED_LENGTH_CAPPED)
    rec.num_cached_tokens = max(req.num_cached_tokens, 0)
    rec.server_ttft_s = None if rec.first_token_s is None else rec.first_token_s - rec.start_s
    rec.server_e2e_s = now - rec.start_s


def _fail_stuck(instances: Sequence[SimInstance], live: dict[str, Request],
                records: dict[str, RequestRecord], now: float) -> int:
    """Finish, failed, every request an idle instance cannot schedule; how many."""
    n = 0
    for inst in instances:
        stuck = [rid for rid in inst.scheduler.requests if rid in live]
        if not stuck:
            continue
        blocks = inst.scheduler.kv_cache_manager.block_pool.num_blocks
        for req in inst.scheduler.finish_requests(stuck, RequestStatus.FINISHED_ERROR):
            rec = records[req.request_id]
            rec.end_s, rec.success = now, False
            rec.error = (f"{inst.name} can never schedule it: {req.num_tokens} tokens need "
                         f"more KV blocks than its pool of {blocks} holds")
            live.pop(req.request_id, None)
            n += 1
    if n == 0:
        raise RuntimeError("the simulation is stuck: work left but nothing can run")
    return n
