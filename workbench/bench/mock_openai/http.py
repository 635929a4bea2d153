"""The mock OpenAI server's HTTP/1.1: read one request from a connection, write one
response head or a whole response.

Place in the flow: `server.MockServer` reads each request with `read_request`
and answers with `send` (a whole body) or `response_head` and its own chunks (a stream).
Stdlib asyncio streams only, so the mock spends less CPU per token than the clients it
measures: keep-alive, Content-Length bodies, chunked streamed responses; no TLS, no
pipelining, no chunked request bodies (refused: 411).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           411: "Length Required"}


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    keep_alive: bool


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """The next request on a connection; None when the client closed it between requests.
    ValueError on a malformed request line or header."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    line, *lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = line.split(" ", 2)
    headers = {}
    for h in lines:
        name, sep, value = h.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {h!r}")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise LookupError("chunked request bodies are not supported: send Content-Length")
    size = int(headers.get("content-length") or 0)
    body = await reader.readexactly(size) if size else b""
    conn = headers.get("connection", "").lower()
    keep = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    return HttpRequest(method, target, headers, body, keep)


def response_head(status: int, ctype: str, keep: bool, length: int | None,
          headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"content-type: {ctype}",
             "transfer-encoding: chunked" if length is None else f"content-length: {length}",
             *(f"{k}: {v}" for k, v in headers.items())]
    if not keep:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send(w: asyncio.StreamWriter, status: int, body: Any, keep: bool,
               headers: dict[str, str] | None = None) -> None:
    """One whole response: None -> empty, str -> text/plain, else JSON."""
    if body is None:
        data, ctype = b"", "application/json"
    elif isinstance(body, str):
        data, ctype = body.encode(), "text/plain; version=0.0.4; charset=utf-8"
    else:
        data, ctype = json.dumps(body).encode(), "application/json"
    w.write(response_head(status, ctype, keep, len(data), headers or {}) + data)
    await w.drain()
