"""One streamed POST to an OpenAI-compatible server -> one RequestRecord: the load
generator's hot path (aiohttp, as vLLM's own benchmark client).

Place in the flow: `http_target.OpenAITarget.generate` runs `stream_completion` on its I/O
loop for every request. Per network read (`StreamReader.readany`: everything the socket had,
often many events at a high rate) the path costs one clock read, shared by every event in
that read, one `bytes.split` (the protocol's `SSEByteDecoder`), then per event one
`json.loads` and the `sse.StreamParser` rules. aiohttp parses HTTP (and the chunked transfer
encoding) in C.

Failures never raise (cancellation aside): an HTTP status other than 200 (with the body's
first 500 characters), a timeout (`timeout_s` between two reads, or to connect), a broken
connection or an error event become `record.success = False` and `record.error`. A
response not read to its end (a failure, a cancellation) closes its connection; a finished
one returns it to the pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp

from workbench.entrypoints.openai.protocol.sse import SSEByteDecoder
from workbench.harness.metrics import RequestRecord
from workbench.harness.sse import StreamParser

CONNECT_TIMEOUT_S = 30.0  # at most, to open a connection (timeout_s when shorter)
JSON_HEADERS = {"content-type": "application/json"}


def new_session(api_key: str | None, timeout_s: float) -> aiohttp.ClientSession:
    """The target's one session: no connection limit, `timeout_s` between two reads of a
    response (not in total: a long stream is not a timeout), no proxy from the environment.
    Call on the loop that will use it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(
        headers=headers, trust_env=False,
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=min(timeout_s, CONNECT_TIMEOUT_S),
                                      sock_read=timeout_s),
    )


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], rid: str,
    record: RequestRecord, info: dict[str, Any], *, chat: bool, now_s: Callable[[], float],
    timeout_s: float,
) -> None:
    """POST `body` (header x-request-id = `rid`) and stream the answer into `record`; `info`
    gets status, the echoed x-request-id and what `StreamParser.info` collects."""
    resp: aiohttp.ClientResponse | None = None
    finished = False
    try:
        resp = await session.post(url, data=json.dumps(body).encode(),
                                  headers={**JSON_HEADERS, "x-request-id": rid})
        info["x_request_id"] = resp.headers.get("x-request-id")
        info["status"] = resp.status
        if resp.status != 200:
            text = (await resp.read()).decode("utf-8", "replace")[:500]
            record.success = False
            record.error = f"HTTP {resp.status} {resp.reason}: {text}"
        else:
            await read_events(resp.content, record, info, chat, now_s)
        finished = True
    except TimeoutError as e:  # aiohttp's ConnectionTimeoutError, SocketTimeoutError
        record.success = False
        record.error = f"timeout ({type(e).__name__}, timeout_s={timeout_s}): {e}"
    except aiohttp.ClientError as e:
        record.success = False
        record.error = f"{type(e).__name__}: {e}"
    finally:
        if resp is not None:
            if finished:
                resp.release()
            else:  # a stream cut short: its connection cannot be reused
                resp.close()
        if record.end_s is None:
            record.end_s = now_s()


async def read_events(
    content: aiohttp.StreamReader, record: RequestRecord, info: dict[str, Any], chat: bool,
    now_s: Callable[[], float],
) -> None:
    """Every SSE event of one response body into `record`; `now_s()` once per read."""
    decoder = SSEByteDecoder()
    parser = StreamParser(record, chat=chat)
    readany, split, feed = content.readany, decoder.feed, parser.feed
    while raw := await readany():
        now = now_s()  # one arrival time for every event in this read
        for data in split(raw):
            feed(data, now)
    now = now_s()
    for data in decoder.flush():
        feed(data, now)
    parser.finish(now)
    info.update(parser.info)
