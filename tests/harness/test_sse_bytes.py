"""The hot path's SSE decoding on bytes (`SSEByteDecoder`) and `StreamParser` fed bytes: the
same events, times and record as the text path, whatever the network reads' boundaries."""

from __future__ import annotations

import json
import re

import pytest

from workbench.entrypoints.openai.protocol.sse import SSEByteDecoder, SSEDecoder
from workbench.harness.metrics import RequestRecord
from workbench.harness.sse import SERVER_KEYS, StreamParser

RAW = (b'data: {"a": 1}\r\n\r\n: ping\n\nevent: x\ndata: {"b":\ndata: 2}\n\n'
       b'data:{"c":3}\r\rdata: \xc3\xa9\n\ndata: [DONE]\n\n')
EVENTS = [b'{"a": 1}', b'{"b":\n2}', b'{"c":3}', "\u00e9".encode(), b"[DONE]"]


@pytest.mark.parametrize("cut", range(len(RAW) + 1))
def test_every_split_of_the_reads_gives_the_same_events(cut: int) -> None:
    dec = SSEByteDecoder()
    assert dec.feed(RAW[:cut]) + dec.feed(RAW[cut:]) + dec.flush() == EVENTS


def test_one_byte_at_a_time_flush_and_the_text_decoder() -> None:
    dec = SSEByteDecoder()
    out = [e for i in range(len(RAW)) for e in dec.feed(RAW[i:i + 1])]
    assert out == EVENTS and dec.flush() == []
    dec = SSEByteDecoder()
    assert dec.feed(b"data: x\r") == [] and dec.flush() == [b"x"]  # unterminated last event
    assert dec.feed(b": comment only") == [] and dec.flush() == []
    text = SSEDecoder()
    assert text.feed(RAW) == [e.decode() for e in EVENTS] and text.flush() == []


def _events(n: int) -> bytes:
    out = b""
    for i in range(n):
        ev = {"id": "cmpl-1", "object": "text_completion", "choices": [
            {"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}],
            "usage": None}
        out += b"data: " + json.dumps(ev).encode() + b"\n\n"
    final = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 7,
                                                      "completion_tokens": n},
             "metrics": {"queue_time_ms": 2.0, "arrival_to_first_token_ms": 10.0}}
    return out + b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"


def test_bytes_and_text_payloads_fill_the_same_record() -> None:
    body = _events(4)
    reads = [body[:150], body[150:151], body[151:420], body[420:]]  # arbitrary boundaries
    records = []
    for as_text in (False, True):
        rec = RequestRecord("r", 0, 0, False)
        dec, parser = SSEByteDecoder(), StreamParser(rec)
        for t, raw in enumerate(reads):
            for data in dec.feed(raw):
                parser.feed(data.decode() if as_text else data, float(t))
        parser.finish(9.0)
        records.append(rec)
        assert parser.info["done"] and parser.info["finish_reason"] == "length"
        assert parser.info["id"] == "cmpl-1"
    assert records[0] == records[1]
    rec = records[0]
    assert rec.success and rec.output_tokens == 4 and rec.prompt_tokens == 7
    assert rec.chunk_tokens == [1, 1, 1, 1]
    assert rec.server_queue_s == pytest.approx(0.002) and rec.server_ttft_s == pytest.approx(0.01)
    # every event of one read has that read's time (one clock read per read): token event k
    # has the time of the read in which its blank line arrived
    ends = [m.end() for m in re.finditer(b"\n\n", body)][:4]
    starts = [sum(len(r) for r in reads[:i]) for i in range(len(reads))]
    assert rec.chunk_times_s == [float(max(i for i, s in enumerate(starts) if s < e))
                                 for e in ends]
    assert rec.chunk_times_s == [0.0, 2.0, 2.0, 3.0]


def test_malformed_bytes_and_the_server_keys() -> None:
    rec = RequestRecord("m", 0, 0, False)
    p = StreamParser(rec)
    p.feed(b'{"a": "\xff"}', 0.1)  # JSON, but not UTF-8
    p.finish(0.2)
    assert not rec.success and rec.error == "malformed SSE data: '{\"a\": \"\ufffd\"}'"
    assert {"queue_time_ms", "e2e_latency_ms", "kv_transfer_bytes", "metrics",
            "server_timing", "timings"} <= SERVER_KEYS
    assert not {"id", "object", "created", "model", "choices", "usage"} & SERVER_KEYS


def test_parse_json_is_json_loads() -> None:
    from workbench.entrypoints.openai.protocol.sse import parse_json

    for payload in ('{"a": [1, 2.5, null]}', ' {"a": 1} ', '{"a": 1}\n', '"\u00e9"', "7"):
        assert parse_json(payload) == json.loads(payload)
        assert parse_json(payload.encode()) == json.loads(payload)
    for bad in ("{}x", "", "{", b"\xff"):
        with pytest.raises(ValueError):
            parse_json(bad)
