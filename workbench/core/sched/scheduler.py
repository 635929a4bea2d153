"""Scheduler (vLLM V1 semantics): one token budget per step, running first, then waiting.

    budget = max_num_batched_tokens
    1. running requests, in order: each gets min(its remaining tokens, budget) new tokens
       (a decode: 1, plus spec tokens; an unfinished prefill: the next chunk). When the KV
       pool is out of blocks, preempt by recompute: the victim (last running under FCFS,
       lowest priority under priority) frees its blocks, num_computed_tokens = 0, and goes
       back to the front of the waiting queue.
    2. waiting requests (only if nobody was preempted this step and fewer than max_num_seqs
       run): prefix-cache lookup, then a chunk of what is left of the budget (chunked
       prefill) or the whole prompt if it fits (no chunked prefill: the request waits).

`update_from_output()` is the one place state changes after a forward: tokens appended,
stop conditions, blocks freed; it reads only the ModelRunnerOutput. The step message is a
delta (`SchedulerOutput`: NewRequestData the first time a request is scheduled, then
CachedRequestData with its new block ids; the whole table after a preemption): the scheduler
remembers how many of each request's block ids the workers hold.

`n > 1` (vLLM V1's parallel sampling): `add_request` fans the request out into n independent
requests (the request itself is index 0, `id#1` ... `id#n-1` the others). They share the
prompt's KV only through the prefix cache, like any two requests: the later ones hit the
full blocks the first one offered to the cache (blocks are cached when allocated, so a
sibling scheduled in the same step hits them too), capped at (num_tokens - 1) // block_size
blocks, and recompute the rest into blocks of their own. Nothing is ever copied: a full
block is never written again (seed 000's copy-on-write question), and a partial block is
never shared. Without prefix caching each sibling computes the whole prompt, as in vLLM.

With a KV connector (`kv_transfer_config`, vLLM's flow): a waiting request's prefix lookup is
the device cache, then the connector's tiers (`get_num_new_matched_tokens`), then compute; an
external hit gets its blocks and waits in WAITING_FOR_REMOTE_KVS (out of the queue, using no
budget, holding a max_num_seqs seat) until the worker reports the load
(`update_from_kv_xfer_finished`), then joins the running requests with those tokens computed
(a request holding blocks must be preemptable, or blocked holders could starve each other).
`preemption_mode="swap"` hands a victim's blocks to the connector's host tier before freeing
them.

With `kv_compression_config` (docs/kv_compression.md) a policy
(`workbench.core.kv_cache.compression`) looks at each running request before its slots are
allocated and may release written blocks from the middle of its table
(`KVCacheManager.evict_blocks`); the request's table is then sent whole (resumed, as after a
copy-on-write step) with its `num_evicted_tokens`. Score-based policies name the queries
whose attention the worker reports (`kv_score_queries`) and read the scores back in
`update_from_output`. A preempted request restarts uncompressed and is evicted again.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.kv_cache import KVCacheManager
from workbench.core.kv_cache.compression.policy import (
    KVCompressionPolicy,
    RequestKVView,
    make_policy,
)
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import NewRequestData, SchedulerOutput
from workbench.core.sched.request_queue import make_request_queue
from workbench.core.sched.utils import check_stop
from workbench.metrics.spec_decode import SpecDecodingStats
from workbench.metrics.stats import PrefixCacheStats, SchedulerStats

if TYPE_CHECKING:
    from workbench.core.sched.kv_connector import SchedulerConnector
    from workbench.distributed.kv_transfer.metadata import KVConnectorOutput


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        num_lookahead_tokens: int = 0,
        connector: SchedulerConnector | None = None,
        num_layers: int = 1,
    ) -> None:
        """`num_layers`: the model's layers (what per-layer KV compression budgets and the
        worker's attention scores are counted over)."""
        self.config = scheduler_config
        self.connector = connector
        self.swap = scheduler_config.preemption_mode == "swap" and connector is not None
        # WAITING_FOR_REMOTE_KVS: request id -> (request, tokens its load makes computed)
        self.loading: dict[str, tuple[Request, int]] = {}
        self._quarantine: dict[str, list] = {}  # timed-out loads' blocks, until released
        # finished requests whose blocks the connector holds for another instance to read
        # (a prefill leg, P2pConnector): freed when it reports them sent (finished_sending)
        self.sending: dict[str, Request] = {}
        # Draft-model speculation: slots for the k draft positions the draft model writes
        # after this step, allocated ahead (vLLM's num_lookahead_tokens).
        self.num_lookahead_tokens = num_lookahead_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.kv_cache_manager = KVCacheManager(
            num_blocks=num_blocks,
            block_size=cache_config.block_size,
            enable_caching=cache_config.enable_prefix_caching,
        )
        kc = cache_config.kv_compression_config
        # KV compression: the eviction policy (None: off); blocks it released this step
        self.kv_policy: KVCompressionPolicy | None = (
            None if kc is None else make_policy(kc, cache_config.block_size, num_layers))
        self.num_layers = num_layers
        self.num_evicted_blocks_last_step = 0
        self.waiting = make_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # Finished since the last schedule(); handed to the worker in the next SchedulerOutput.
        self.finished_req_ids: set[str] = set()
        # The step message's delta: request id -> how many of its block ids the workers hold
        # (absent: the workers have not seen it); preempted since their last step.
        self._num_sent_blocks: dict[str, int] = {}
        self._resumed: set[str] = set()
        self.num_preemptions_last_step = 0
        # Set by update_from_output: tokens appended (stops truncate a verification's
        # tokens) and prompt tokens of requests that got their first token (n > 1 children
        # excluded), for the vllm:generation_tokens / vllm:prompt_tokens counters.
        self.num_generated_last_step = 0
        self.num_prompt_tokens_last_step = 0
        # this step's verifications (update_from_output), until make_stats() reports them
        self._spec_decoding_stats: SpecDecodingStats | None = None

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)
        if request.sampling_params.n > 1 and request.parent_id is None:
            for child in self._fan_out(request):
                self.requests[child.request_id] = child
                self.waiting.add(child)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.loading) or (
            self.connector is not None and self.connector.has_pending_work())

    def finish_requests(
        self,
        request_ids: list[str],
        status: RequestStatus,
        errors: dict[str, str] | None = None,
        num_valid_tokens: dict[str, int] | None = None,
    ) -> list[Request]:
        """Abort (or otherwise finish) requests wherever they are; frees their blocks.

        FINISHED_ERROR: `errors[id]` becomes `request.error`; `num_valid_tokens[id]` (after a
        failed forward) makes the KV manager drop the prefix-cache keys of blocks whose KV
        may be unwritten. A request that an update failing half-way already marked finished
        is still taken out of the queues and freed."""
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or (req.is_finished() and status != RequestStatus.FINISHED_ERROR):
                continue
            # its load may still write its blocks: freed when the load is done
            loading = req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            elif not req.is_finished():
                if not loading:  # a loading request is in neither queue
                    self.waiting.remove(req)
            elif req in self.running:  # an update that failed after check_stop finished it
                self.running.remove(req)
            req.status = status
            if errors is not None:
                req.error = errors.get(rid)
            if not loading and not self._connector_finished(req):
                self.kv_cache_manager.free(
                    req, None if num_valid_tokens is None else num_valid_tokens.get(rid)
                )
            self.requests.pop(rid, None)
            self._forget(rid)
            done.append(req)
        return done

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        kv = self.kv_cache_manager
        out = SchedulerOutput()
        if self.finished_req_ids:
            out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        budget: int = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        scheduled: list[Request] = []
        num_sched = out.num_scheduled_tokens
        preempted: list[Request] = []
        self.num_evicted_blocks_last_step = 0

        # 1. Running requests.
        max_model_len = self.max_model_len
        running = self.running
        spec_out = out.scheduled_spec_decode_tokens
        lookahead = self.num_lookahead_tokens
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_computed = req.num_computed_tokens
            num_new = len(req.all_token_ids) + len(req.spec_token_ids) - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if num_new > max_model_len - num_computed:
                num_new = max_model_len - num_computed
            if num_new <= 0:
                i += 1
                continue
            num_spec = num_computed + num_new - len(req.all_token_ids)
            if num_spec > 0:  # drafts that fit the budget are verified; the rest dropped
                spec_out[req.request_id] = req.spec_token_ids[:num_spec]
            if self.kv_policy is not None:
                self._evict(req, num_new)
            while kv.allocate_slots(req, num_new, num_lookahead_tokens=lookahead) is None:
                victim = self._pick_victim()
                if victim.request_id in num_sched:  # a policy that preempts out of order
                    budget += num_sched.pop(victim.request_id)
                    scheduled.remove(victim)
                    spec_out.pop(victim.request_id, None)
                    i -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                spec_out.pop(req.request_id, None)
                break  # the request preempted itself: nothing left to take blocks from
            scheduled.append(req)
            num_sched[req.request_id] = num_new
            budget -= num_new
            i += 1

        # 2. Waiting requests, unless the pool just ran dry.
        if not preempted:
            self._schedule_waiting(scheduled, num_sched, budget)

        out.blocks_to_copy = kv.take_copy_ops()
        self._fill_request_data(out, scheduled)
        if self.kv_policy is not None:
            self._fill_kv_compression(out, scheduled)
        out.preempted_request_ids = [r.request_id for r in preempted]
        self.num_preemptions_last_step = len(preempted)
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    def _fill_request_data(self, out: SchedulerOutput, scheduled: list[Request]) -> None:
        """The message's delta for each scheduled request, in batch order: NewRequestData for
        one the workers have not seen, else CachedRequestData with the block ids appended
        since (the whole table after a preemption, or on a step that copies blocks); and the
        prefill/decode split of the step's tokens."""
        num_sched = out.num_scheduled_tokens
        cached = out.scheduled_cached_reqs
        # bound appends, not CachedRequestData.append: this loop runs for every request
        # every step (bench sched's figure is mostly this loop and update_from_output's)
        add_id = cached.req_ids.append
        add_resumed = cached.resumed_from_preemption.append
        add_blocks = cached.new_block_ids.append
        add_computed = cached.num_computed_tokens.append
        block_ids_view = self.kv_cache_manager.block_ids_view
        sent = self._num_sent_blocks
        resumed_ids = self._resumed
        rewrite = bool(out.blocks_to_copy)  # copy-on-write replaced held blocks
        now = time.perf_counter()
        prefill_tokens = decode_tokens = 0
        for req in scheduled:
            rid = req.request_id
            nc = req.num_computed_tokens
            if nc >= len(req.prompt_token_ids):
                decode_tokens += num_sched[rid]  # one token, plus any drafts being verified
            else:
                prefill_tokens += num_sched[rid]
            ids = block_ids_view(rid)
            have = sent.get(rid)
            if have is None:
                out.scheduled_new_reqs.append(NewRequestData.from_request(req, list(ids)))
                if req.times.first_scheduled is None:
                    req.times.first_scheduled = now
                sent[rid] = len(ids)
            elif rewrite or rid in resumed_ids:
                add_id(rid)
                add_resumed(True)
                add_blocks(list(ids))
                add_computed(nc)
                resumed_ids.discard(rid)
                sent[rid] = len(ids)
                evicted = self.kv_cache_manager.num_evicted_tokens(rid)
                if evicted:  # the whole table: the workers take the offset with it
                    out.num_evicted_tokens[rid] = evicted
            else:
                add_id(rid)
                add_resumed(False)
                add_computed(nc)
                if len(ids) > have:
                    add_blocks(ids[have:])
                    sent[rid] = len(ids)
                else:
                    add_blocks(None)  # no new block: the count sent stands
        out.total_num_scheduled_tokens = prefill_tokens + decode_tokens
        out.num_prefill_tokens = prefill_tokens
        out.num_decode_tokens = decode_tokens

    def _schedule_waiting(self, scheduled: list[Request], num_sched: dict[str, int],
                          budget: int) -> None:
        cfg = self.config
        kv = self.kv_cache_manager
        threshold = cfg.long_prefill_token_threshold
        # a loading request holds blocks and a seat: it counts against max_num_seqs
        while len(self.waiting) and budget > 0 and \
                len(self.running) + len(self.loading) < cfg.max_num_seqs:
            req = self.waiting.peek()
            if req.num_computed_tokens == 0:
                computed_blocks, num_computed = kv.get_computed_blocks(req)
            else:  # a loaded request
                computed_blocks, num_computed = [], 0
            if self.connector is not None and req.num_computed_tokens == 0:
                ext, load_async = self.connector.get_num_new_matched_tokens(req, num_computed)
                if ext > 0 and load_async:
                    if not self._start_load(req, computed_blocks, num_computed, ext):
                        break
                    continue
            num_new = req.num_tokens - req.num_computed_tokens - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                if not cfg.enable_chunked_prefill:
                    break  # block scheduling: the whole prompt must fit in one step
                num_new = budget
            if kv.allocate_slots(
                req, num_new, computed_blocks, num_computed, self.num_lookahead_tokens
            ) is None:
                break
            self.waiting.pop()
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens += num_computed
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_computed
            if self.connector is not None:
                self.connector.update_state_after_alloc(req, kv.block_ids_view(req.request_id), 0)
            scheduled.append(req)
            num_sched[req.request_id] = num_new
            budget -= num_new

    def _start_load(self, req: Request, computed_blocks: list, num_computed: int,
                    ext: int) -> bool:
        """Blocks for the device hit and the `ext` external tokens (not offered to the prefix
        cache until loaded), then WAITING_FOR_REMOTE_KVS; False when the pool is full."""
        kv = self.kv_cache_manager
        if kv.allocate_slots(req, ext, computed_blocks, num_computed,
                             delay_cache_blocks=True) is None:
            return False
        self.waiting.pop()
        req.num_computed_tokens = num_computed
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_computed + ext
        if req.times.first_scheduled is None:
            req.times.first_scheduled = time.perf_counter()
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        req.times.kv_load_start = req.times.first_scheduled
        self.loading[req.request_id] = (req, ext)
        assert self.connector is not None
        self.connector.update_state_after_alloc(req, kv.block_ids_view(req.request_id), ext)
        return True

    def update_from_kv_xfer_finished(self, output: KVConnectorOutput) -> None:
        """Loads reported done join the front of the waiting queue with their tokens
        computed (and their blocks offered to the prefix cache); failed ones recompute
        them. A request finished while loading is freed now."""
        assert self.connector is not None
        self.connector.update_connector_output(output)
        kv = self.kv_cache_manager
        for rid in sorted(output.released):  # a timed-out load's blocks, its copy now over
            kv.release_blocks(self._quarantine.pop(rid, []))
        for rid in sorted(output.finished_sending):  # another instance read them
            held = self.sending.pop(rid, None)
            if held is not None:
                kv.free(held)
        for rid in sorted(output.finished_recving | output.failed_recving
                          | output.timed_out_recving):
            entry = self.loading.pop(rid, None)
            if entry is None:
                continue
            req, ext = entry
            if rid in output.timed_out_recving:  # still being written: set them aside
                self._quarantine[rid] = kv.detach_blocks(req)
                req.num_computed_tokens = 0
                if req.is_finished():
                    self._connector_finished(req)
                    continue
            elif req.is_finished():
                if not self._connector_finished(req):
                    kv.free(req)
                continue
            req.times.kv_load_done = time.perf_counter()
            info = output.recv_info.get(rid)
            if info is not None:
                req.times.kv_transfer_bytes, req.times.kv_transfer_s = info
            if rid in output.finished_recving:
                req.num_computed_tokens += ext
                self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens)
            if rid in output.timed_out_recving:  # holds nothing now: queued again
                req.status = RequestStatus.WAITING
                self.waiting.prepend(req)
            else:  # holds its blocks: it runs (and is preemptable) like any running request
                req.status = RequestStatus.RUNNING
                self.running.append(req)

    def _connector_finished(self, req: Request) -> bool:
        """Tell the connector; True when it holds the blocks (freed when it reports them
        sent), and its kv_transfer_params go to the client."""
        if self.connector is None:
            return False
        delay, params = self.connector.request_finished(
            req, self.kv_cache_manager.block_ids_view(req.request_id))
        req.kv_transfer_params = params
        if delay:
            self.sending[req.request_id] = req
        return delay

    # ------------------------------------------------------- KV compression
    def _kv_view(self, req: Request, num_new: int) -> RequestKVView:
        kv = self.kv_cache_manager
        assert self.kv_policy is not None
        rid = req.request_id
        kept = tuple(kv.kept_logical_blocks(rid))
        drop = kv.layer_drop(rid)
        return RequestKVView(
            request_id=rid, num_prompt_tokens=req.num_prompt_tokens, num_tokens=req.num_tokens,
            num_computed_tokens=req.num_computed_tokens, num_new_tokens=num_new,
            block_size=kv.block_size, kept_blocks=kept,
            num_logical_blocks=len(kept) + kv.num_evicted_tokens(rid) // kv.block_size,
            budget_tokens=self.kv_policy.budget_tokens(req.num_prompt_tokens),
            num_layers=self.num_layers,
            layer_drop=() if drop is None else tuple(tuple(d) for d in drop))

    def _evict(self, req: Request, num_new: int) -> None:
        """The policy's decision for a running request about to get `num_new` tokens,
        applied before its slots are allocated; a changed table is sent whole."""
        assert self.kv_policy is not None
        decision = self.kv_policy.select(self._kv_view(req, num_new))
        if decision is None or decision.is_empty:
            return
        kv = self.kv_cache_manager
        evict = list(decision.evict)
        layer_drop = decision.layer_drop
        if layer_drop is not None:  # a block every layer drops leaves the shared table
            common = set.intersection(*(set(d) for d in layer_drop)) if layer_drop else set()
            limit = req.num_computed_tokens // kv.block_size
            evict = sorted(set(evict) | {b for b in common if b < limit})
            layer_drop = [[b for b in d if b not in evict] for d in layer_drop]
        num = kv.evict_blocks(req, evict)
        if layer_drop is not None:
            kv.set_layer_drop(req, layer_drop)
        self.num_evicted_blocks_last_step += num
        req.times.kv_evicted_blocks += num
        if req.request_id in self._num_sent_blocks:  # the workers' row changes in the middle
            self._resumed.add(req.request_id)

    def _fill_kv_compression(self, out: SchedulerOutput, scheduled: list[Request]) -> None:
        """The step message's KV compression part: which queries the worker scores and each
        request's per-layer row drops."""
        policy = self.kv_policy
        assert policy is not None
        kv = self.kv_cache_manager
        num_sched = out.num_scheduled_tokens
        for req in scheduled:
            rid = req.request_id
            if policy.needs_scores:
                span = policy.score_queries(self._kv_view(req, num_sched[rid]))
                if span is not None:
                    out.kv_score_queries[rid] = span
            drops = kv.layer_drop_positions(rid)
            if drops is not None and any(drops):
                out.kv_layer_drops[rid] = drops

    def _observe_scores(self, out: SchedulerOutput, scores: dict) -> None:
        """Hand the worker's attention scores to the policy, with the view the forward ran
        with (before this update advances num_computed_tokens)."""
        assert self.kv_policy is not None
        for rid, s in scores.items():
            req = self.requests.get(rid)
            n = out.num_scheduled_tokens.get(rid)
            if req is None or n is None or req.is_finished():
                continue
            self.kv_policy.observe(rid, self._kv_view(req, n), s)

    def _pick_victim(self) -> Request:
        return self.waiting.preemption_victim(self.running)  # the policy's choice

    def _preempt(self, req: Request) -> None:
        if self.kv_policy is not None:  # it restarts uncompressed
            self.kv_policy.forget(req.request_id)
        if self.swap:
            assert self.connector is not None
            self.connector.request_preempted(
                req, self.kv_cache_manager.block_ids_view(req.request_id))
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        if req.request_id in self._num_sent_blocks:  # the workers keep its state: resumed
            self._resumed.add(req.request_id)
        self.waiting.prepend(req)

    def _free(self, req: Request) -> None:
        if self.kv_policy is not None:  # what it kept, for its metrics
            req.times.kv_kept_tokens = (req.num_computed_tokens
                                        - self.kv_cache_manager.num_evicted_tokens(req.request_id))
        if not self._connector_finished(req):
            self.kv_cache_manager.free(req)
        self.requests.pop(req.request_id, None)
        self._forget(req.request_id)

    def _forget(self, rid: str) -> None:
        """A finished request: the workers drop it at the next step."""
        if self.kv_policy is not None:
            self.kv_policy.forget(rid)
        self.finished_req_ids.add(rid)
        self._num_sent_blocks.pop(rid, None)
        self._resumed.discard(rid)

    # ------------------------------------------------------------------ update
    def update_from_output(
        self, out: SchedulerOutput, model_runner_output: ModelRunnerOutput,
        failed: dict[str, str] | None = None,
    ) -> tuple[list[Request], list[Request]]:
        """Apply one forward's results (vLLM's name). Returns (requests that got tokens,
        finished ones).

        `model_runner_output.sampled_token_ids` holds, for each request whose computed tokens
        reached its end this step, the accepted token ids (one without speculation; accepted
        drafts + one with it). A request mid-prefill gets none. Rejected drafts roll back:
        num_computed_tokens counts only the scheduled tokens whose KV matches the confirmed
        tokens. The drafts for the next step come in `update_draft_token_ids`.

        With `failed` (request id -> error), requests whose sampling already failed are
        skipped, and one whose own update raises is added there instead of stopping the
        others (the caller then finishes them all with FINISHED_ERROR); without it, raises.
        """
        now = time.perf_counter()
        progressed: list[Request] = []
        finished: list[Request] = []
        max_model_len = self.max_model_len
        sampled = model_runner_output.sampled_token_ids
        spec = out.scheduled_spec_decode_tokens
        requests = self.requests
        generated = prompt_tokens = 0
        if self.kv_policy is not None and model_runner_output.kv_block_scores:
            self._observe_scores(out, model_runner_output.kv_block_scores)
        for rid, num_scheduled in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None or (failed is not None and rid in failed):
                continue
            # inline, not a per-request call: this loop runs for every request every step
            try:
                new = sampled.get(rid)
                num_rejected = 0
                if req.spec_token_ids:
                    req.spec_token_ids = []
                    drafts = spec.get(rid)
                    if drafts and new:
                        num_rejected = len(drafts) + 1 - len(new)
                req.num_computed_tokens += num_scheduled - num_rejected
                if not new:
                    continue
                token_times = req.times.token_times
                before = len(req.output_token_ids)
                for tok in new:
                    req.output_token_ids.append(tok)
                    req.all_token_ids.append(tok)
                    token_times.append(now)
                    if check_stop(req, max_model_len):
                        break
                generated += len(req.output_token_ids) - before
                if before == 0 and req.parent_id is None:
                    prompt_tokens += req.num_prompt_tokens
                if req.times.first_token is None:
                    req.times.first_token = now
                progressed.append(req)
                if req.status >= RequestStatus.FINISHED_STOPPED:
                    req.times.finished = now
                    self.running.remove(req)
                    self._free(req)
                    finished.append(req)
            except Exception as e:
                if failed is None:
                    raise
                failed[rid] = f"update failed: {type(e).__name__}: {e}"
                for seen in (progressed, finished):
                    if req in seen:
                        seen.remove(req)
        self.num_generated_last_step = generated
        self.num_prompt_tokens_last_step = prompt_tokens
        if spec:
            self._observe_spec_decoding(spec, sampled)
        return progressed, finished

    def _observe_spec_decoding(
        self, spec: dict[str, list[int]], sampled: dict[str, list[int]]
    ) -> None:
        """Count each verification whose request got tokens (accepted = tokens - 1)."""
        for rid, drafts in spec.items():
            tokens = sampled.get(rid)
            if tokens:  # none: its request failed
                if self._spec_decoding_stats is None:
                    self._spec_decoding_stats = SpecDecodingStats()
                self._spec_decoding_stats.observe_draft(len(drafts), len(tokens) - 1)

    def make_stats(self) -> SchedulerStats:
        """The step's report (vLLM's name), once after each step's update: queue sizes and
        KV usage now; preemptions, prefix-cache lookups, tokens, verifications and the KV
        connector's counters since the last report (taking them resets them)."""
        queries, hits = self.kv_cache_manager.make_prefix_cache_stats()
        stats = SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_stats=PrefixCacheStats(queries, hits),
            num_preemptions=self.num_preemptions_last_step,
            num_generation_tokens=self.num_generated_last_step,
            num_prompt_tokens=self.num_prompt_tokens_last_step,
            spec_decoding_stats=self._spec_decoding_stats,
            kv_blocks_in_use=self.kv_cache_manager.num_blocks - 1
            - self.kv_cache_manager.num_free_blocks,
            num_evicted_blocks=self.num_evicted_blocks_last_step,
        )
        self.num_generated_last_step = self.num_prompt_tokens_last_step = 0
        self._spec_decoding_stats = None
        if self.connector is not None:
            stats.kv_connector_stats = self.connector.make_stats()
            stats.num_waiting_for_remote_kvs = len(self.loading)
            stats.kv_offload_cpu_usage = self.connector.host_usage
        return stats

    def update_draft_token_ids(self, spec_token_ids: dict[str, list[int]]) -> None:
        """Store the worker's drafts (`ModelRunnerOutput.spec_token_ids`, verified next step)
        on the requests still running after this step's update (vLLM's name); a request that
        finished, failed or left gets none. Their distributions stay on the worker."""
        requests = self.requests
        for rid, drafts in spec_token_ids.items():
            req = requests.get(rid)
            if req is None or req.status != RequestStatus.RUNNING:
                continue
            req.spec_token_ids = drafts

    @staticmethod
    def _fan_out(parent: Request) -> list[Request]:
        """The n - 1 siblings of an `n > 1` request (vLLM's ParentRequest.get_child_info):
        same prompt, n = 1, seed + index when seeded, in index order. Prompt logprobs belong
        to index 0's output only."""
        params = parent.sampling_params
        return [
            Request(
                request_id=f"{parent.request_id}#{idx}",
                prompt_token_ids=parent.prompt_token_ids,
                sampling_params=replace(
                    params, n=1, seed=None if params.seed is None else params.seed + idx,
                    prompt_logprobs=None),
                eos_token_id=parent.eos_token_id,
                arrival_time=parent.times.arrival,
                priority=parent.priority,
                cache_salt=parent.cache_salt,
                max_tokens=parent.max_tokens,
                parent_id=parent.request_id,
                index=idx,
            )
            for idx in range(1, params.n)
        ]
