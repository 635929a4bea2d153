"""A host-memory KV tier in the simulator: the OffloadingConnector's scheduler side
(CPUOffloadingSpec, `workbench/distributed/kv_transfer/offloading_connector.py`) on the real
host-slot bookkeeping (`HostTier`: LRU by block hash, a slot pending until its step ends,
pinned while a load reads it), with loads priced by bytes over the instance's host link.

    device prefix cache  ──miss──> host tier  ──miss──> compute
                                   hit: the consecutive host blocks after the device hit
                                   (capped at the prompt minus its last token) load at
                                   bytes / bandwidth + latency, then count as computed

Saves (write-through, as the real connector): every full block a step completes is stored to
a host slot after that step (a block already there is touched), so a block the device prefix
cache evicts is still in the tier while the LRU keeps it. Stores go device -> host, the other
direction of a full-duplex link, after the forward: their bytes and seconds are counted
(`vllm:kv_offload_store_bytes` / `_time`), not put on any request's path. Loads queue on the
instance's link one at a time (`LinkQueue`).

Counters (the real connector's names): `vllm:external_prefix_cache_queries` / `_hits`
(tokens looked up past the device hit / loaded), `workbench:kv_offload_host_hits`,
`vllm:kv_offload_load_bytes` / `_time`, `vllm:kv_offload_store_bytes` / `_time`,
`workbench:kv_offload_store_skipped` (every slot pinned or pending).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.core.kv_cache.hashing import BlockHash, extend_block_hashes, sha256_hash_fn
from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata
from workbench.distributed.kv_transfer.tiers import HostTier
from workbench.sim.connectors import Load, SimConnector
from workbench.sim.transfer import LinkQueue

if TYPE_CHECKING:
    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput
    from workbench.distributed.kv_transfer.metadata import KVConnectorOutput


class _State:
    __slots__ = ("hashes", "lookup", "num_stored", "pinned", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.hashes: list[BlockHash] = []
        self.num_stored = 0  # leading blocks saved (or found saved)
        self.pinned: list[int] = []
        self.lookup = (0, 0)  # (tokens looked up, tokens hit) of the last lookup


class CPUTierConnector(SimConnector):
    """`num_blocks` host slots of one device block each, behind `link`."""

    def __init__(self, num_blocks: int, block_size: int, kv_bytes_per_token: int,
                 link: LinkQueue) -> None:
        super().__init__(kv_bytes_per_token)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"CPUTierConnector: block_size ({block_size!r}) must be an "
                             "integer >= 1")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"CPUTierConnector: num_blocks ({num_blocks!r}) must be an "
                             "integer >= 1 (host slots)")
        self.host = HostTier(num_blocks)
        self.block_size = block_size
        self.link = link
        self._reqs: dict[str, _State] = {}
        self._pending: list[int] = []  # slots stored by the running step

    def _state(self, request: Request) -> _State:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _State(request)
        st.request = request
        return st

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        st = self._state(request)
        if request.sampling_params.prompt_logprobs is not None:
            st.lookup = (0, 0)
            return 0, False  # every prompt position's logits are computed
        bs = self.block_size
        num_tokens = len(request.all_token_ids)
        max_blocks = (num_tokens - 1) // bs  # the last token is always recomputed
        extend_block_hashes(sha256_hash_fn, st.hashes, request.all_token_ids, bs, max_blocks,
                            request.cache_salt)
        end = num_computed_tokens // bs
        while end < max_blocks and self.host.lookup(st.hashes[end]) is not None:
            end += 1
        ext = max(0, end * bs - num_computed_tokens)
        st.lookup = (num_tokens, ext)
        return ext, ext > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        st = self._state(request)
        queries, hits = st.lookup
        st.lookup = (0, 0)
        self._count("vllm:external_prefix_cache_queries", queries)
        self._count("vllm:external_prefix_cache_hits", hits)
        if num_external_tokens <= 0:
            return
        bs = self.block_size
        first = request.num_computed_tokens // bs
        for i in range(first, first + num_external_tokens // bs):
            slot = self.host.lookup(st.hashes[i])
            assert slot is not None, "a block the lookup found is gone before its load"
            self.host.pin(slot)
            self.host.touch(st.hashes[i])
            st.pinned.append(slot)
        n = num_external_tokens
        self._count("workbench:kv_offload_host_hits", n)
        self._loads.append(Load(request.request_id, n, n * self.kv_bytes_per_token, self.link))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        bs = self.block_size
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs.get(rid)
            if st is None:
                continue
            req = st.request
            full = min(req.num_computed_tokens + n, len(req.all_token_ids)) // bs
            if full <= st.num_stored:
                continue
            extend_block_hashes(sha256_hash_fn, st.hashes, req.all_token_ids, bs, full,
                                req.cache_salt)
            for j in range(st.num_stored, full):
                slot, skipped = self.host.admit(st.hashes[j])
                if skipped:
                    self._count("workbench:kv_offload_store_skipped", 1)
                if slot is None:
                    continue
                self._pending.append(slot)
                nbytes = bs * self.kv_bytes_per_token
                self._count("vllm:kv_offload_store_bytes", nbytes)
                self._count("vllm:kv_offload_store_time",
                            nbytes / self.link.link.bandwidth_bytes_per_s)
            st.num_stored = full
        return KVConnectorMetadata()

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """At a step boundary: the stores planned so far are in host memory (loadable);
        finished loads unpin their slots and count their bytes."""
        self.host.complete(self._pending)
        self._pending = []
        for rid in output.finished_recving | output.failed_recving:
            st = self._reqs.get(rid)
            if st is not None:
                self._unpin(st)
            info = output.recv_info.get(rid)
            if info is not None and rid in output.finished_recving:
                self._count("vllm:kv_offload_load_bytes", info[0])
                self._count("vllm:kv_offload_load_time", info[1])

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._unpin(st)
        return False, None

    def _unpin(self, st: _State) -> None:
        for slot in st.pinned:
            self.host.unpin(slot)
        st.pinned = []

    @property
    def host_usage(self) -> float:
        return self.host.usage
