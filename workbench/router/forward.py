"""The router's request path: pick a replica, forward, and retry on a failed replica.

    client -> Router.forward(routed) -> policy.choose(loads) -> replica i
        JSON:   POST to i; connection fails or breaks -> i marked dead, same body to the next
        stream: open i's stream (a failure before its status: same as JSON), then relay its
                events; if it breaks mid-way -> i marked dead, `StreamRelay.resume()` gives the
                restart or the continuation, sent to the next live replica, and so on

Every attempt counts in `replica.requests_total` and holds `replica.outstanding` until its
response is read or fails; a failed attempt that goes on to another replica counts in the
failed replica's `retries_total`. A request tries each live replica at most once (or
`max_attempts`); with none left the client gets a 503 (JSON) or an error event (stream).
HTTP errors from a replica (a 400 for a bad request, ...) are the request's answer, not a
replica failure: they are returned as they are. Only transport failures (refused or reset
connections, a stream cut before `[DONE]`) mark a replica dead.

`pick_from(policy, members, ...)` is the choice among some replicas with some policy: the
disaggregated router (`disagg.py`) picks its prefill and decode legs with it. A `picked` list
passed to `forward_json` / `forward_stream` receives every replica an attempt went to, in order.
A request's `kv_transfer_params` (the decode leg's) go with its first attempt only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi.responses import JSONResponse, Response

from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.http import ClosingStreamingResponse
from workbench.entrypoints.openai.protocol.sse import SSEDecoder
from workbench.router.config import RouterConfig
from workbench.router.policies import NoLiveReplicaError, ReplicaLoad, RoutingPolicy
from workbench.router.pool import Replica, ReplicaPool
from workbench.router.prompts import RoutedRequest
from workbench.router.relay import Continuation, StreamRelay

logger = logging.getLogger(__name__)
FORWARD_HEADERS = ("authorization", "x-request-id")
RETURN_HEADERS = ("content-type", "x-request-id")


class Router:
    def __init__(self, pool: ReplicaPool, policy: RoutingPolicy, config: RouterConfig,
                 tokenizer: Any, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`transport`: how the replicas are reached (default: HTTP; tests pass a mock)."""
        self.pool, self.policy, self.config, self.tokenizer = pool, policy, config, tokenizer
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0), trust_env=False, transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self.decisions: Counter[str] = Counter()
        self.client_requests = 0  # requests received on /v1/*completions
        self.failed_requests = 0  # requests no live replica could finish
        self.resumed_streams = 0  # streams continued on another replica mid-way
        self.restarted_requests = 0  # requests sent again from scratch after a failure

    async def aclose(self) -> None:
        await self.client.aclose()

    def healthy(self) -> bool:
        """Whether a request can be served now: some replica is alive."""
        return bool(self.pool.live())

    # ---------------------------------------------------------------- choosing
    def pick(self, routed: RoutedRequest, tried: set[int]) -> Replica:
        """The policy's choice among live replicas not yet tried; NoLiveReplicaError."""
        return self.pick_from(self.policy, self.pool.replicas, routed, tried)

    def pick_from(self, policy: RoutingPolicy, members: list[Replica], routed: RoutedRequest,
                  tried: set[int]) -> Replica:
        """`policy`'s choice among the live `members` not yet tried (at most `max_attempts`
        or len(members) tries); the attempt is counted on the replica. NoLiveReplicaError."""
        limit = self.config.max_attempts or len(members)
        if len(tried) >= limit:
            raise NoLiveReplicaError(f"tried {len(tried)} replica(s), the limit")
        eligible = {r.index for r in members if r.alive and r.index not in tried}
        loads = [ReplicaLoad(r.index, r.outstanding, r.index in eligible)
                 for r in self.pool.replicas]
        decision = policy.choose(loads, routed.route)
        self.decisions[decision.reason] += 1
        replica = self.pool.replicas[decision.replica]
        tried.add(replica.index)
        replica.requests_total += 1
        replica.outstanding += 1
        return replica

    def replica_failed(self, replica: Replica, reason: str) -> None:
        self.pool.mark_dead(replica, reason)

    def replica_recovered(self, replica: Replica) -> None:
        """The pool brought `replica` back (alive, its new URL set): routed to from now on."""
        logger.warning("replica %d is back at %s (restart %d); routed to again",
                       replica.index, replica.base_url, replica.restarts_total)

    @staticmethod
    def done(replica: Replica) -> None:
        replica.outstanding -= 1

    # ---------------------------------------------------------------- JSON
    async def forward_json(self, routed: RoutedRequest, headers: dict[str, str],
                           picked: list[Replica] | None = None) -> Response:
        tried: set[int] = set()
        failed: Replica | None = None
        while True:
            try:
                replica = self.pick(routed, tried)
            except NoLiveReplicaError as e:
                self.failed_requests += 1
                raise APIError(f"no live replica could serve the request: {e}", 503) from None
            if picked is not None:
                picked.append(replica)
            body = routed.body
            if failed is not None:
                failed.retries_total += 1
                self.restarted_requests += 1
            elif routed.kv_transfer_params is not None:  # the first attempt only
                body = {**body, "kv_transfer_params": routed.kv_transfer_params}
            try:
                resp = await self.client.post(replica.base_url + routed.path, json=body,
                                              headers=headers)
            except httpx.TransportError as e:
                self.replica_failed(replica, f"{type(e).__name__}: {e}")
                failed = replica
                continue
            finally:
                self.done(replica)
            return Response(resp.content, resp.status_code, headers=response_headers(resp.headers))

    # ---------------------------------------------------------------- streams
    async def forward_stream(self, routed: RoutedRequest, headers: dict[str, str],
                             picked: list[Replica] | None = None) -> Response:
        relay = StreamRelay(routed, self.tokenizer)
        tried: set[int] = set()
        picked = picked if picked is not None else []
        opened = await self._open(routed, relay.first_request(), headers, tried, None, picked)
        if isinstance(opened, Response):
            return opened
        body = self._relay(routed, relay, headers, tried, picked, *opened)
        out_headers = {k: v for k, v in response_headers(opened[1].headers).items()
                       if k != "content-type"}
        return ClosingStreamingResponse(body, media_type="text/event-stream", headers=out_headers)

    async def _open(
        self, routed: RoutedRequest, req: Continuation, headers: dict[str, str],
        tried: set[int], failed: Replica | None, picked: list[Replica],
    ) -> tuple[Replica, httpx.Response] | Response:
        """A replica's stream with status 200, or the Response to give the client instead
        (a replica's HTTP error as it is, or 503 when no live replica is left)."""
        while True:
            try:
                replica = self.pick(routed, tried)
            except NoLiveReplicaError as e:
                self.failed_requests += 1
                err = APIError(f"no live replica could serve the request: {e}", 503)
                return JSONResponse(err.body(), status_code=503)
            picked.append(replica)
            if failed is not None:
                failed.retries_total += 1
                if req.restart:
                    self.restarted_requests += 1
                else:
                    self.resumed_streams += 1
                failed = None
            request = self.client.build_request("POST", replica.base_url + req.path,
                                                json=req.body, headers=headers)
            try:
                resp = await self.client.send(request, stream=True)
            except httpx.TransportError as e:
                self.replica_failed(replica, f"{type(e).__name__}: {e}")
                self.done(replica)
                failed = replica
                req = _first_attempt_only(routed, req)
                continue
            if resp.status_code != 200:
                content = await resp.aread()
                await resp.aclose()
                self.done(replica)
                return Response(content, resp.status_code, headers=response_headers(resp.headers))
            return replica, resp

    async def _relay(
        self, routed: RoutedRequest, relay: StreamRelay, headers: dict[str, str],
        tried: set[int], picked: list[Replica], replica: Replica, resp: httpx.Response,
    ) -> AsyncIterator[str]:
        while True:
            broken: str | None = None
            try:
                async for payload in _payloads(resp):
                    for event in relay.feed(payload):
                        yield event
                    if relay.done:
                        break
                else:
                    broken = "the stream ended before [DONE]"
            except httpx.TransportError as e:
                broken = f"the stream broke: {type(e).__name__}: {e}"
            finally:
                with anyio.CancelScope(shield=True):
                    await resp.aclose()
                if broken is not None and not relay.done:  # counted while still in flight
                    self.replica_failed(replica, broken)
                self.done(replica)
            if broken is None or relay.done:
                return
            plan = relay.resume()
            if isinstance(plan, list):  # finished here (or cannot be resumed)
                for event in plan:
                    yield event
                self.failed_requests += int(relay.failed)
                return
            opened = await self._open(routed, plan, headers, tried, replica, picked)
            if isinstance(opened, Response):
                self.failed_requests += int(opened.status_code != 503)  # 503: counted
                message = bytes(opened.body).decode("utf-8", "replace")[:300]
                for event in relay.error_events(f"the stream could not be completed on "
                                                f"another replica: {message}"):
                    yield event
                return
            replica, resp = opened


def _first_attempt_only(routed: RoutedRequest, req: Continuation) -> Continuation:
    """`req` without the disaggregated prefill's kv_transfer_params (for the next replica:
    the prefill's KV is meant for the first one)."""
    params = routed.kv_transfer_params
    if params is None or req.body.get("kv_transfer_params") != params:
        return req
    body = {k: v for k, v in req.body.items() if k != "kv_transfer_params"}
    return Continuation(req.path, body, req.restart)


async def _payloads(resp: httpx.Response) -> AsyncIterator[str]:
    dec = SSEDecoder()
    async for raw in resp.aiter_bytes():
        for data in dec.feed(raw):
            yield data
    for data in dec.flush():
        yield data


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    """The replica's response headers the client gets (content type, request id)."""
    return {k: headers[k] for k in RETURN_HEADERS if k in headers}


def forward_headers(headers: Any) -> dict[str, str]:
    """The client headers a replica needs (auth, request id)."""
    return {k: headers[k] for k in FORWARD_HEADERS if k in headers}
