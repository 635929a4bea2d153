"""StreamRelay on scripted replica streams: a break mid-stream is resumed with prompt + tokens
so far, and the client sees one coherent stream (text, usage, ids, stop strings)."""

from __future__ import annotations

import json
from typing import Any

from workbench.router.prompts import RoutedRequest, routed_request
from workbench.router.relay import Continuation, StreamRelay

# token id -> bytes; 7 + 8 is "é" split over two tokens
VOCAB = {10: b"a", 11: b"b", 12: b"c", 13: b" ", 14: b"X", 15: b"Y", 7: b"\xc3", 8: b"\xa9"}


class ByteTokenizer:
    """decode = the tokens' bytes as UTF-8 (U+FFFD for an incomplete character)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


TOK = ByteTokenizer()
RID, CREATED, MODEL = "cmpl-abc", 1700000000, "m"


def chunk(text: str, ids: list[int], finish: str | None = None, chat: bool = False,
          **extra: Any) -> str:
    if chat:
        delta: dict[str, Any] = {"content": text} if text or finish is None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason=finish, stop_reason=None, token_ids=ids)
    kind = "chat.completion.chunk" if chat else "text_completion"
    return json.dumps({"id": RID, "object": kind, "created": CREATED, "model": MODEL,
                       "choices": [choice], **extra})


def usage_chunk(prompt: int, completion: int, **extra: Any) -> str:
    return json.dumps({"id": "cmpl-other", "object": "text_completion", "created": 1,
                       "model": MODEL, "choices": [],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion,
                                 "prompt_tokens_details": {"cached_tokens": 4}}, **extra})


def request(**body: Any) -> RoutedRequest:
    base = {"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0.0, "stream": True}
    return routed_request("completions", {**base, **body}, TOK)


def events(out: list[str]) -> list[Any]:
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in out)
    return [e[6:-2] if e[6:-2] == "[DONE]" else json.loads(e[6:-2]) for e in out]


def feed(relay: StreamRelay, payloads: list[str]) -> list[Any]:
    return [e for p in payloads for e in events(relay.feed(p))]


def text_of(evs: list[Any], chat: bool = False) -> str:
    key = (lambda c: c["delta"].get("content") or "") if chat else (lambda c: c["text"])
    return "".join(key(c) for e in evs if isinstance(e, dict) for c in e.get("choices", []))


def test_first_request_asks_for_token_ids_and_drops_what_the_server_would_not_send() -> None:
    relay = StreamRelay(request(), TOK)
    first = relay.first_request()
    assert first == Continuation("/v1/completions", {**request().body,
                                                     "return_token_ids": True}, True)
    evs = feed(relay, [chunk("a", [10]), chunk("", [7]), chunk("é", [8]),
                       chunk("", [11], finish="length"), "[DONE]"])
    # the ids-only chunk (held-back half character) is dropped; token_ids are removed
    assert [e["choices"][0]["text"] for e in evs[:-1]] == ["a", "é", ""]
    assert all("token_ids" not in e["choices"][0] for e in evs[:-1]) and evs[-1] == "[DONE]"
    assert relay.generated[0] == [10, 7, 8, 11] and relay.done and relay.resume() == []


def test_break_mid_stream_resumes_with_prompt_plus_tokens_and_rebuilds_text() -> None:
    req = request(stream_options={"include_usage": True}, min_tokens=4, seed=3, stop=["zz"])
    relay = StreamRelay(req, TOK)
    sent = feed(relay, [chunk("a", [10]), chunk("", [7])])  # then the replica dies
    assert text_of(sent) == "a"
    plan = relay.resume()
    assert isinstance(plan, Continuation) and not plan.restart
    assert plan.path == "/v1/completions"
    assert plan.body == {
        "temperature": 0.0, "seed": 3, "prompt": [1, 2, 3, 10, 7], "stream": True,
        "return_token_ids": True, "max_tokens": 4, "min_tokens": 2,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False}}
    # the new replica decodes [8] alone as U+FFFD; the router decodes all ids instead
    rest = feed(relay, [chunk("\ufffd", [8]), chunk("b", [11]), chunk("", [12]),
                        chunk("X", [14], finish="length"),
                        usage_chunk(5, 4, metrics={"num_output_tokens": 4, "e2e_latency_ms": 9}),
                        "[DONE]"])
    assert text_of(sent + rest) == "aébcX"
    assert all(e["id"] == RID and e["object"] == "text_completion" and e["created"] == CREATED
               for e in rest if isinstance(e, dict))
    finish, usage = rest[-3], rest[-2]
    assert finish["choices"][0]["finish_reason"] == "length" and "metrics" not in finish
    assert usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9,
                              "prompt_tokens_details": {"cached_tokens": 3}}
    assert usage["metrics"] == {"num_output_tokens": 6, "e2e_latency_ms": 9}
    assert rest[-1] == "[DONE]" and relay.resumes == 1


def test_resume_applies_stop_strings_across_the_break_and_keeps_ids() -> None:
    relay = StreamRelay(request(stop=["bX"], return_token_ids=True, max_tokens=None), TOK)
    sent = feed(relay, [chunk("a", [10]), chunk("", [11])])  # "b" held back by the server
    plan = relay.resume()
    assert isinstance(plan, Continuation) and "max_tokens" not in plan.body
    assert "stop" not in plan.body and plan.body["prompt"] == [1, 2, 3, 10, 11]
    rest = feed(relay, [chunk("X", [14]), chunk("Y", [15])])
    assert text_of(sent + rest) == "a"  # "bX" straddles the break: cut before it
    last = rest[-2]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"], last["token_ids"]) == ("stop", "bX", [14])
    assert rest[-1] == "[DONE]" and relay.done
    assert relay.feed(chunk("Y", [15])) == []  # the caller closes the replica stream


def test_nothing_sent_restarts_and_finished_or_exhausted_streams_end_here() -> None:
    relay = StreamRelay(request(), TOK)
    assert feed(relay, [chunk("", [7])]) == []  # nothing reached the client
    plan = relay.resume()
    assert isinstance(plan, Continuation) and plan.restart and relay.generated == {}

    relay = StreamRelay(request(max_tokens=2, stream_options={"include_usage": True}), TOK)
    feed(relay, [chunk("a", [10]), chunk("b", [11])])  # both tokens, then no finish chunk
    final = events(relay.resume())  # type: ignore[arg-type]
    assert final[0]["choices"][0]["finish_reason"] == "length"
    assert final[1]["usage"]["completion_tokens"] == 2 and final[2] == "[DONE]"

    relay = StreamRelay(request(), TOK)
    feed(relay, [chunk("a", [10], finish="length")])  # finished; [DONE] was lost
    assert events(relay.resume()) == ["[DONE]"]  # type: ignore[arg-type]


def test_several_choices_are_not_resumed_once_tokens_were_sent() -> None:
    relay = StreamRelay(request(n=2), TOK)
    feed(relay, [chunk("a", [10])])
    evs = events(relay.resume())  # type: ignore[arg-type]
    assert evs[0]["error"]["code"] == 502 and "several choices" in evs[0]["error"]["message"]
    assert evs[1] == "[DONE]" and relay.failed


def test_chat_stream_resumes_as_chat_deltas() -> None:
    routed = request()
    chat = RoutedRequest(**{**routed.__dict__, "kind": "chat"})
    relay = StreamRelay(chat, TOK)
    role = json.dumps({"id": RID, "object": "chat.completion.chunk", "created": CREATED,
                       "model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                         "content": ""},
                                                    "finish_reason": None}]})
    sent = feed(relay, [role, chunk("a", [10], chat=True)])
    plan = relay.resume()
    assert isinstance(plan, Continuation) and plan.path == "/v1/completions"
    rest = feed(relay, [chunk("b", [11]), chunk("c", [12], finish="length"),
                        usage_chunk(5, 2, metrics={"num_output_tokens": 2}), "[DONE]"])
    assert text_of(sent + rest, chat=True) == "abc"
    assert [e["object"] for e in rest[:-1]] == ["chat.completion.chunk"] * 2
    assert rest[0]["choices"][0]["delta"] == {"content": "b"}
    assert rest[1]["choices"][0]["finish_reason"] == "length"
    assert rest[1]["metrics"] == {"num_output_tokens": 3}  # no usage asked: on the finish
