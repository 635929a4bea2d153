"""Server-sent events as OpenAI streams them: `data: {json}` events, then `data: [DONE]`.

Server side (`workbench serve`, the router): `encode_event(chunk)` is one event, compact JSON
(`DONE_EVENT` ends a stream). Client side (the router reading a replica, the harness's load
generator, tools): `SSEByteDecoder` turns bytes as they arrive into complete `data:`
payloads; `SSEDecoder` is the same with text payloads; `parse_json` reads one payload.

    encode_event({"id": ...}) == 'data: {"id":...}\\n\\n'
    SSEByteDecoder().feed(b'data: {"a":1}\\n\\ndata: [DO') == [b'{"a":1}']   (the rest waits)

Decoding follows the SSE rules that OpenAI-compatible servers use: events end at a blank
line; comments, other fields, CRLF and CR line ends are handled; several `data:` lines of one
event are joined by newlines.
"""

from __future__ import annotations

import json
from typing import Any

DONE = ("[DONE]", b"[DONE]")  # the last payload of a stream, as text or bytes
DONE_EVENT = "data: [DONE]\n\n"


def encode_event(payload: dict[str, Any] | str) -> str:
    """One event: a dict as compact JSON, a string (`[DONE]`) as is."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


_raw_decode = json.JSONDecoder().raw_decode


def parse_json(data: str | bytes) -> Any:
    """`json.loads` of one payload (SSE is UTF-8), without its per-call overhead in the usual
    case (nothing around the value); anything else goes through `json.loads` itself, so the
    result and the errors (ValueError) are the same."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        value, end = _raw_decode(text)
        if end == len(text):
            return value
    except ValueError:
        pass
    return json.loads(text)


class SSEByteDecoder:
    """Bytes as they arrive -> complete `data:` payloads as bytes: the hot path's decoder.

    One `bytes.split` per network read and no text decoding (a blank line, b"\\n\\n", never
    falls inside a UTF-8 character, and `json.loads` reads bytes). Events end at a blank line;
    comments, other fields, CRLF and CR line ends are handled (a CR at the end of a read waits
    for the next one: it may be half a CRLF); b"[DONE]" is returned as is.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            tail = b"\r" if buf.endswith(b"\r") else b""
            body = buf[: len(buf) - len(tail)]
            buf = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out = []
        for event in events:
            if event[:6] == b"data: " and b"\n" not in event:  # one data line: the usual
                out.append(event[6:])
            elif (data := _data_lines(event)) is not None:
                out.append(data)
        return out

    def flush(self) -> list[bytes]:
        """A last event the server did not terminate with a blank line."""
        event, self._buf = self._buf.replace(b"\r", b"\n"), b""
        data = _data_lines(event)
        return [] if data is None else [data]


def _data_lines(event: bytes) -> bytes | None:
    """The `data:` lines of one event joined by newlines (one leading space dropped from
    each); None when it has none (a comment, another field)."""
    lines = [ln[5:].removeprefix(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


class SSEDecoder:
    """`SSEByteDecoder` with text payloads (the router, tools and tests that read a whole
    response)."""

    def __init__(self) -> None:
        self._bytes = SSEByteDecoder()

    def feed(self, chunk: bytes) -> list[str]:
        return [data.decode("utf-8") for data in self._bytes.feed(chunk)]

    def flush(self) -> list[str]:
        """A last event the server did not terminate with a blank line."""
        return [data.decode("utf-8") for data in self._bytes.flush()]
