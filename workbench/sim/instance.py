"""One simulated engine instance: the real `Scheduler` (and its KV cache manager) stepping on
a virtual clock, each step's duration predicted by a `CostModel`.

    inst = SimInstance("i0", scheduler_config, cache_config, num_blocks, cost_model)
    inst.add(request)                 # a core Request, arrival_time on the virtual clock
    end = inst.start_step(now)        # schedule(); None when nothing can run now
    got = inst.finish_step()          # at `end`: update_from_output() with the sampled tokens

With a KV connector (`sim.connectors`: a prefill/decode handshake or a host tier) the loads
the scheduler starts in a step are timed on their link (`Load.start_s` / `done_s`) and
reported done at the first step boundary at or after they end: the end of the running step
(`finish_step`, with its output, as vLLM's worker reports them), or, idle, at `complete_loads`
(the simulator calls it at `next_load_s()`). `post` hands the scheduler a connector output
from elsewhere (a decode instance's read done: the producer's `finished_sending`).

Every scheduled request whose computed tokens reach its end gets one token (`SIM_TOKEN`;
requests ignore EOS, so `max_tokens` ends them, as the harness's workloads ask). With a
`SpecDecodeModel` each decoding request carries k draft tokens into the next step and a
verification accepts a run of them drawn position by position with the stated acceptance
rate (seeded; one draw per draft position in batch order), plus the bonus token: the
scheduler's own rejection bookkeeping rolls the rest back.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.batch_composition import compose
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.distributed.kv_transfer.metadata import KVConnectorOutput
from workbench.sim.batch import BatchComposition, CostModel
from workbench.sim.connectors import Load, SimConnector

SIM_TOKEN = 7  # every simulated token: no model, and requests ignore EOS


@dataclass(frozen=True)
class SpecDecodeModel:
    """Speculative decoding as an acceptance model: k drafts per decoding request per step,
    each accepted with `acceptance_rate` given the ones before it were."""

    num_speculative_tokens: int
    acceptance_rate: float
    seed: int = 0

    def __post_init__(self) -> None:
        k, a = self.num_speculative_tokens, self.acceptance_rate
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"SpecDecodeModel num_speculative_tokens ({k!r}) must be an "
                             "integer >= 1")
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1:
            raise ValueError(f"SpecDecodeModel acceptance_rate ({a!r}) must be in [0, 1]")


@dataclass
class StepResult:
    """One finished step: the requests that got tokens (with how many), the finished ones,
    and the step's row for the step trace."""

    tokens: dict[str, int] = field(default_factory=dict)
    finished: list[Request] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)
    loads: list[Load] = field(default_factory=list)  # KV loads reported done at its end


class SimInstance:
    """`step_noise`: the relative spread of a step's time around the cost model's prediction
    (each step's time is multiplied by a lognormal draw with mean 1 and this sigma, seeded by
    `noise_seed`): repeats of a measured run differ, so simulated repeats differ too and the
    verdict's interval means what it means on measured runs. 0: deterministic times."""

    def __init__(self, name: str, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_blocks: int, cost_model: CostModel,
                 spec_decode: SpecDecodeModel | None = None, step_noise: float = 0.0,
                 noise_seed: int = 0, connector: SimConnector | None = None) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"SimInstance {name}: num_blocks ({num_blocks!r}) must be an "
                             "integer >= 2")
        if isinstance(step_noise, bool) or not isinstance(step_noise, int | float) or \
                not 0 <= step_noise < 1:
            raise ValueError(f"SimInstance {name}: step_noise ({step_noise!r}) must be in "
                             "[0, 1) (a relative spread)")
        self.step_noise = float(step_noise)
        self._noise = random.Random(noise_seed)
        self.name = name
        self.connector = connector
        self.scheduler = Scheduler(scheduler_config, cache_config, num_blocks,
                                   connector=connector)
        self._loads: list[tuple[float, int, Load]] = []  # (done, order, load), a heap
        self._num_loads = 0
        self._inbox: list[KVConnectorOutput] = []  # posted while a step ran
        self.cost_model = cost_model
        self.spec_decode = spec_decode
        self._rng = random.Random(spec_decode.seed if spec_decode else 0)
        self._pending: tuple[SchedulerOutput, BatchComposition, float, float] | None = None
        self.steps = 0
        self.busy_s = 0.0
        # vLLM's counters over the run (the harness reads a server's delta of these)
        self.counters = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0,
                         "vllm:num_preemptions": 0.0, "vllm:generation_tokens": 0.0,
                         "vllm:prompt_tokens": 0.0}

    def reset_stats(self) -> None:
        """Zero the step count, busy time and counters (after an unmeasured warm-up pass);
        the KV cache, prefix cache included, stays."""
        self.steps, self.busy_s = 0, 0.0
        self.counters = dict.fromkeys(self.counters, 0.0)

    def _absorb(self) -> None:
        if self.connector is not None:
            for key, value in self.connector.take_counters().items():
                self.counters[key] = self.counters.get(key, 0.0) + value

    def _time_loads(self, now: float) -> None:
        """Put the loads the scheduler just started on their links."""
        assert self.connector is not None
        for load in self.connector.take_loads():
            load.asked_s = now
            if load.link is None or load.num_bytes == 0:
                load.start_s = load.done_s = now
            else:
                load.start_s, load.done_s = load.link.reserve(now, load.num_bytes)
            heapq.heappush(self._loads, (load.done_s, self._num_loads, load))
            self._num_loads += 1

    def next_load_s(self) -> float | None:
        """When the earliest running load ends (None: none runs)."""
        return self._loads[0][0] if self._loads else None

    def _report(self, until: float) -> list[Load]:
        """Tell the scheduler of the loads done by `until` and of what was posted."""
        done: list[Load] = []
        while self._loads and self._loads[0][0] <= until:
            done.append(heapq.heappop(self._loads)[2])
        out = KVConnectorOutput(
            finished_recving={ld.request_id for ld in done},
            recv_info={ld.request_id: (ld.num_bytes, ld.done_s - ld.start_s) for ld in done})
        for posted in self._inbox:
            out.finished_sending |= posted.finished_sending
            out.stats.add(posted.stats)
        self._inbox = []
        self.scheduler.update_from_kv_xfer_finished(out)
        self._absorb()
        return done

    def complete_loads(self, now: float) -> list[Load]:
        """Idle at `now`: report the loads done by then (none while a step runs)."""
        if self.connector is None or self._pending is not None or not (
                self._loads and self._loads[0][0] <= now):
            return []
        return self._report(now)

    def post(self, output: KVConnectorOutput) -> None:
        """A connector output from elsewhere: applied now when idle, else at the step's end."""
        if self.connector is None:
            raise RuntimeError(f"SimInstance {self.name}: no KV connector to post to")
        self._inbox.append(output)
        if self._pending is None:
            self._report(-1.0)

    @property
    def busy(self) -> bool:
        return self._pending is not None

    @property
    def num_unfinished(self) -> int:
        """Requests in this instance (waiting or running): the router's load signal."""
        return len(self.scheduler.requests)

    def add(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def start_step(self, now: float) -> float | None:
        """Schedule one step at `now`; its end time, or None when nothing could be scheduled
        (an empty pool or no request): the instance stays idle."""
        if self._pending is not None:
            raise RuntimeError(f"SimInstance {self.name}: a step is already running")
        out = self.scheduler.schedule()
        if self.connector is not None:
            self._time_loads(now)
            self._absorb()
        cache = self.scheduler.kv_cache_manager.make_prefix_cache_stats()
        self.counters["vllm:prefix_cache_queries"] += cache.queries
        self.counters["vllm:prefix_cache_hits"] += cache.hits
        self.counters["vllm:num_preemptions"] += len(out.preempted_request_ids)
        if out.total_num_scheduled_tokens == 0:
            return None
        batch = compose(self.scheduler.requests, out)
        dt = self.cost_model.step_time_s(batch)
        if not dt > 0:
            raise ValueError(f"the cost model predicted {dt!r} s for {batch}; a step takes > 0 s")
        if self.step_noise:
            s = self.step_noise
            dt *= self._noise.lognormvariate(-s * s / 2, s)
        self._pending = (out, batch, now, now + dt)
        return now + dt

    def finish_step(self) -> StepResult:
        """Apply the running step's output at its end time (vLLM's update_from_output)."""
        if self._pending is None:
            raise RuntimeError(f"SimInstance {self.name}: no step is running")
        out, batch, start, end = self._pending
        self._pending = None
        sched = self.scheduler
        sampled: dict[str, list[int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests.get(rid)
            if req is None or req.num_computed_tokens + n < req.num_tokens:
                continue  # mid-prefill: no token yet
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            sampled[rid] = [SIM_TOKEN] * (1 + self._accepted(len(drafts)))
        before = {rid: len(sched.requests[rid].output_token_ids) for rid in sampled}
        progressed, finished = sched.update_from_output(
            out, ModelRunnerOutput(sampled_token_ids=sampled))
        if self.spec_decode is not None:
            k = self.spec_decode.num_speculative_tokens
            sched.update_draft_token_ids({
                r.request_id: [SIM_TOKEN] * k for r in progressed
                if r.status == RequestStatus.RUNNING})
        tokens = {r.request_id: len(r.output_token_ids) - before[r.request_id]
                  for r in progressed}  # a stop cuts a verification's tokens short
        loads = self._report(end) if self.connector is not None else []
        self.counters["vllm:generation_tokens"] += sched.num_generated_last_step
        self.counters["vllm:prompt_tokens"] += sched.num_prompt_tokens_last_step
        self.steps += 1
        self.busy_s += end - start
        row = {"instance": self.name, "start_s": start, "time_s": end, "step_s": end - start,
               "num_seqs": batch.num_seqs, "prefill_tokens": batch.prefill_tokens,
               "decode_tokens": batch.decode_tokens, "draft_tokens": batch.draft_tokens,
               "running": len(sched.running), "waiting": len(sched.waiting),
               "kv_cache_usage_perc": sched.kv_cache_manager.usage,
               "preemptions": len(out.preempted_request_ids)}
        return StepResult(tokens, finished, row, loads)

    def _accepted(self, num_drafts: int) -> int:
        if num_drafts == 0 or self.spec_decode is None:
            return 0
        a, j = self.spec_decode.acceptance_rate, 0
        while j < num_drafts and self._rng.random() < a:
            j += 1
        return j
