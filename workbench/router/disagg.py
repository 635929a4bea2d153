"""Disaggregated prefill/decode: each request's prefill on a prefill replica, its decode on a
decode replica that reads the prefill's KV (vLLM's disaggregated-serving proxy flow, its
`toy_proxy_server.py` for the NixlConnector).

    client ──> DisaggRouter ──1. prefill leg──> prefill replica (prefill_policy)
                   │   client body + max_tokens 1, stream false, no stream_options,
                   │   kv_transfer_params = PREFILL_KV_TRANSFER_PARAMS (do_remote_decode)
                   │ <── JSON with a top-level `kv_transfer_params` (null: nothing to read)
                   └──2. decode leg──> decode replica (decode_policy)
                       client body (streaming or not) + the returned kv_transfer_params;
                       its answer / stream goes back to the client as the colocated
                       router's does (`forward.Router`: retries, mid-stream resume)

Failures, nothing lost:
    prefill replica refuses / breaks / answers 5xx / answers a body that is not JSON
        -> marked dead, the prefill goes to the next live prefill replica ("prefill retry")
    no prefill replica left -> the decode leg without kv_transfer_params: the decode replica
        computes the prefill itself ("prefill fallback")
    prefill answers 4xx     -> that answer is the client's, as it is (no decode leg)
    decode replica dies     -> the router's retry / resume; a retried, restarted or resumed
        decode attempt goes WITHOUT kv_transfer_params (that replica recomputes the prompt)

`--kv-push` (`config.kv_push`, `disagg_push.py`): the decode replica is chosen first (its
attempt counted on it) and its side channel named in the prefill request, so a layerwise
prefill replica pushes the KV there while it prefills; the decode leg's first attempt goes to
that replica when it is alive, else to another one (which pulls, as without push).

The client's own `kv_transfer_params` never reach a replica: the prefill leg's are replaced by
PREFILL_KV_TRANSFER_PARAMS and the decode leg carries only what the prefill returned (or
none), as vLLM's proxy overwrites them; a client could otherwise have a decode replica
connect to a host:port of its choosing, or read another request's held KV.

A request of several choices (n > 1) or several prompts is refused (400 naming the field):
one prefill hands over one sequence's KV. Both legs carry the same X-Request-Id (the
client's, else a new one), as vLLM's proxy sends.

Recorded per request (`DisaggRecord`, the last `max_records` at GET /router/requests): the
prefill replicas tried, the prefill leg's seconds (first attempt sent -> its answer read),
whether params came back or the prefill fell back, the decode replicas tried and the decode
leg's time to first byte (decode leg started -> the first byte the router can send the
client: the first stream event, or the whole JSON answer). `metrics.disagg_families` exports
the counters and both times as histograms. `clock` is injectable, so tests script time.
"""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import httpx
from fastapi.responses import Response
from starlette.responses import StreamingResponse

from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.router.config import RouterConfig
from workbench.router.disagg_push import SideChannels
from workbench.router.forward import Router, response_headers
from workbench.router.policies import NoLiveReplicaError
from workbench.router.pool import Replica, ReplicaPool
from workbench.router.prompts import RoutedRequest

logger = logging.getLogger(__name__)

# What the prefill request asks of the prefill replica's connector (vLLM's, verbatim):
# keep the KV for a remote decode; the replica answers with where to read it.
PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
# vLLM's TTFT histogram buckets (seconds)
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_ID = "x-request-id"


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: the client's with max_tokens 1 (max_completion_tokens 1 when
    given), stream false, no stream_options, min_tokens at most 1 (more would be refused
    against max_tokens 1) and PREFILL_KV_TRANSFER_PARAMS."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    if body.get("min_tokens"):
        out["min_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    return out


def without_client_params(routed: RoutedRequest) -> RoutedRequest:
    """`routed` whose body has no `kv_transfer_params` (the client's are never forwarded)."""
    if "kv_transfer_params" not in routed.body:
        return routed
    return replace(routed, body={k: v for k, v in routed.body.items()
                                 if k != "kv_transfer_params"})


def check_disaggregable(routed: RoutedRequest) -> None:
    """APIError (400, naming the field) for a request one prefill cannot hand over."""
    n = routed.body.get("n")
    if n is not None and n != 1:
        raise APIError(f"n ({n!r}) must be 1 with disaggregated prefill/decode: one prefill "
                       "hands over the KV of one sequence; send n requests instead", 400, "n")
    if routed.prompt_token_ids is None:
        raise APIError(f"prompt: a batch of {routed.num_choices} prompts is not served with "
                       "disaggregated prefill/decode; send one prompt per request", 400,
                       "prompt")


@dataclass
class Histogram:
    """Observations counted into `buckets` (upper bounds, seconds) plus +Inf."""

    buckets: tuple[float, ...] = SECONDS_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf; not cumulative
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if list(self.buckets) != sorted(set(self.buckets)) or not self.buckets:
            raise ValueError(f"buckets ({self.buckets}) must be increasing and not empty")
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """[(le, observations <= le)], ending with ("+Inf", count): Prometheus buckets."""
        out, total = [], 0
        for le, n in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            total += n
            out.append((le, float(total)))
        return out


@dataclass
class DisaggRecord:
    """One client request through the disaggregated router."""

    seq: int  # arrival order at the router
    request_id: str  # the X-Request-Id both legs carried
    stream: bool
    prefill_replicas: list[int] = field(default_factory=list)  # attempts, in order
    # ok (params returned) | no_params (null: the decode recomputes) | fallback (no prefill
    # replica could answer) | client_error (the prefill's 4xx went back to the client)
    prefill_outcome: str = ""
    prefill_s: float | None = None  # first prefill attempt sent -> the answer read
    decode_replicas: list[int] = field(default_factory=list)  # attempts, in order
    pushed_to: int | None = None  # kv_push: the decode replica named in the prefill leg
    decode_status: int | None = None  # the decode leg's HTTP status
    decode_first_byte_s: float | None = None  # decode leg sent -> first byte for the client


class DisaggRouter(Router):
    """`Router` whose requests take a prefill leg (among the "prefill" replicas, with
    `config.prefill_policy`) and then a decode leg (`Router.forward_*` over the "decode"
    replicas, with `config.decode_policy`)."""

    def __init__(self, pool: ReplicaPool, config: RouterConfig, tokenizer: Any,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.perf_counter, max_records: int = 1000) -> None:
        if not config.disaggregated:
            raise ValueError("config has num_prefill 0 and num_decode 0 (colocated); give both "
                             ">= 1 for a disaggregated router")
        super().__init__(pool, config.make_policy(config.decode_policy), config, tokenizer,
                         transport=transport)
        self.prefill_members = pool.with_role("prefill")
        self.decode_members = pool.with_role("decode")
        if not self.prefill_members or not self.decode_members:
            raise ValueError(f"the pool's roles ({[r.role for r in pool.replicas]}) must "
                             "include a prefill and a decode replica")
        self.prefill_policy = config.make_policy(config.prefill_policy)
        self.decode_policy = self.policy
        self.clock = clock
        self.prefill_requests: Counter[int] = Counter()  # prefill attempts per replica
        self.prefill_retries = 0  # failed prefill attempts retried on another prefill replica
        self.prefill_fallbacks = 0  # requests whose prefill the decode replica computed
        self.prefill_no_params = 0  # prefills answered with null kv_transfer_params
        self.prefill_seconds = Histogram()
        self.decode_first_byte_seconds = Histogram()
        self.records: deque[DisaggRecord] = deque(maxlen=max_records)
        self._seq = 0
        self.side_channels = SideChannels(self.client) if config.kv_push else None
        self.push_requests = 0  # prefill legs that named a decode replica to push to
        self.push_misses = 0  # ... whose decode leg could not start there (it pulled)

    def healthy(self) -> bool:
        """A decode replica is alive (a prefill can always fall back to it)."""
        return any(r.alive for r in self.decode_members)

    def pick(self, routed: RoutedRequest, tried: set[int]) -> Replica:
        """The decode leg's replica (`Router.forward_*` call this): with kv_push the first
        attempt goes to the replica the KV was pushed to (counted when it was chosen)."""
        pinned = routed.pushed_to
        if pinned is not None and not tried:
            replica = self.pool.replicas[pinned]
            tried.add(pinned)
            if replica.alive:
                return replica
            self.done(replica)  # its reservation
            self.push_misses += 1
        return self.pick_from(self.decode_policy, self.decode_members, routed, tried)

    def replica_failed(self, replica: Replica, reason: str) -> None:
        super().replica_failed(replica, reason)
        if self.side_channels is not None:
            self.side_channels.forget(replica)

    async def push_target(self, routed: RoutedRequest, record: DisaggRecord
                          ) -> tuple[Replica, dict[str, Any]] | None:
        """kv_push: the decode replica (chosen now, its attempt counted) and the fields that
        name its side channel in the prefill request; None without one."""
        if self.side_channels is None:
            return None
        try:
            replica = self.pick_from(self.decode_policy, self.decode_members, routed, set())
        except NoLiveReplicaError:
            return None
        channel = await self.side_channels.get(replica)
        if channel is None:
            self.done(replica)
            replica.requests_total -= 1  # not an attempt after all
            return None
        record.pushed_to = replica.index
        self.push_requests += 1
        return replica, {"remote_host": channel[0], "remote_port": channel[1]}

    async def _legs(self, routed: RoutedRequest, headers: dict[str, str],
                    record: DisaggRecord) -> RoutedRequest | Response:
        """The prefill leg (pushing to a decode replica chosen first, with kv_push): the
        decode leg's request, or the answer for the client."""
        target = await self.push_target(routed, record)
        params = await self.prefill(routed, headers, record,
                                    None if target is None else target[1])
        if isinstance(params, Response) or params is None or target is None:
            if target is not None:
                self.done(target[0])  # no KV to decode with there: a plain pick
                self.push_misses += 1
            return params if isinstance(params, Response) else \
                replace(routed, kv_transfer_params=params)
        return replace(routed, kv_transfer_params=params, pushed_to=target[0].index)

    # ---------------------------------------------------------------- the two legs
    async def forward_json(self, routed: RoutedRequest, headers: dict[str, str],
                           picked: list[Replica] | None = None) -> Response:
        check_disaggregable(routed)
        routed = without_client_params(routed)
        record, headers = self._start(routed, headers)
        try:
            decode = await self._legs(routed, headers, record)
            if isinstance(decode, Response):
                return decode
            picked = [] if picked is None else picked
            start = self.clock()
            try:
                resp = await super().forward_json(decode, headers, picked)
            finally:
                record.decode_replicas = [r.index for r in picked]
            self._first_byte(record, start, resp.status_code)
            return resp
        finally:
            self.records.append(record)

    async def forward_stream(self, routed: RoutedRequest, headers: dict[str, str],
                             picked: list[Replica] | None = None) -> Response:
        check_disaggregable(routed)
        routed = without_client_params(routed)
        record, headers = self._start(routed, headers)
        decode = await self._legs(routed, headers, record)
        if isinstance(decode, Response):
            self.records.append(record)
            return decode
        picked = [] if picked is None else picked
        start = self.clock()
        resp = await super().forward_stream(decode, headers, picked)
        if not isinstance(resp, StreamingResponse):  # the decode leg's error answer
            record.decode_replicas = [r.index for r in picked]
            self._first_byte(record, start, resp.status_code)
            self.records.append(record)
            return resp
        resp.body_iterator = self._timed(resp.body_iterator, record, start, picked)
        return resp

    async def prefill(self, routed: RoutedRequest, headers: dict[str, str],
                      record: DisaggRecord, push_to: dict[str, Any] | None = None
                      ) -> dict[str, Any] | None | Response:
        """The prefill leg: the kv_transfer_params to decode with (None: decode without),
        or the prefill replica's 4xx answer for the client. `push_to`: the decode replica's
        side channel (remote_host, remote_port) for the prefill replica to push to."""
        body = prefill_body(routed.body)
        if push_to is not None:
            body["kv_transfer_params"].update(push_to)
        tried: set[int] = set()
        failed: Replica | None = None
        start = self.clock()
        while True:
            try:
                replica = self.pick_from(self.prefill_policy, self.prefill_members, routed, tried)
            except NoLiveReplicaError as e:
                if failed is not None:
                    failed.retries_total += 1  # it went elsewhere: to a decode replica
                self.prefill_fallbacks += 1
                record.prefill_outcome = "fallback"
                record.prefill_s = self.clock() - start
                logger.warning("request %s: no prefill replica could prefill (%s); the decode "
                               "replica computes the prompt", record.request_id, e)
                return None
            record.prefill_replicas.append(replica.index)
            self.prefill_requests[replica.index] += 1
            if failed is not None:
                failed.retries_total += 1
                self.prefill_retries += 1
            try:
                resp = await self.client.post(replica.base_url + routed.path, json=body,
                                              headers=headers)
            except httpx.TransportError as e:
                self.replica_failed(replica, f"prefill: {type(e).__name__}: {e}")
                failed = replica
                continue
            finally:
                self.done(replica)
            if resp.status_code >= 500:
                self.replica_failed(replica, f"prefill answered {resp.status_code}: "
                                    f"{resp.text[:200]}")
                failed = replica
                continue
            if resp.status_code != 200:
                record.prefill_outcome = "client_error"
                record.prefill_s = self.clock() - start
                return Response(resp.content, resp.status_code,
                                headers=response_headers(resp.headers))
            try:
                answer = resp.json()
            except ValueError as e:
                self.replica_failed(replica, f"prefill answered 200 without JSON: {e}")
                failed = replica
                continue
            record.prefill_s = self.clock() - start
            self.prefill_seconds.observe(record.prefill_s)
            params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            if isinstance(params, dict) and params:
                record.prefill_outcome = "ok"
                return params
            record.prefill_outcome = "no_params"
            self.prefill_no_params += 1
            return None

    # ---------------------------------------------------------------- records
    def _start(self, routed: RoutedRequest, headers: dict[str, str]
               ) -> tuple[DisaggRecord, dict[str, str]]:
        """A new record, and the headers both legs send (one X-Request-Id)."""
        self._seq += 1
        request_id = headers.get(REQUEST_ID) or f"disagg-{uuid.uuid4().hex}"
        return (DisaggRecord(self._seq, request_id, routed.stream),
                {**headers, REQUEST_ID: request_id})

    def _first_byte(self, record: DisaggRecord, start: float, status: int) -> None:
        record.decode_status = status
        record.decode_first_byte_s = self.clock() - start
        self.decode_first_byte_seconds.observe(record.decode_first_byte_s)

    async def _timed(self, events: AsyncIterable[Any], record: DisaggRecord, start: float,
                     picked: list[Replica]) -> AsyncIterator[Any]:
        """`events` as they are; the first one's time is the decode leg's first byte, the
        record is kept when the stream ends (however it ends)."""
        try:
            async for event in events:
                if record.decode_first_byte_s is None:
                    self._first_byte(record, start, 200)
                yield event
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    await aclose()
            record.decode_replicas = [r.index for r in picked]
            self.records.append(record)
