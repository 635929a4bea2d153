"""Input the JSON parser lets through but no field may hold is a 400 naming the field: lone
surrogates in any string (tokenized, rendered or not), non-finite numbers in any field,
arrays past the cap, token ids outside the vocabulary. Bodies are sent raw, as a hostile
client would (httpx's `json=` cannot even encode a lone surrogate)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServerHandle
from workbench.entrypoints.openai.protocol.json_values import BadValue, check_json_values
from workbench.entrypoints.openai.protocol.requests import ChatCompletionRequest, CompletionRequest

CHAT = [{"role": "user", "content": "hi"}]


def _post(s: ServerHandle, path: str, raw: str) -> httpx.Response:
    return httpx.post(f"{s.base_url}/v1/{path}", content=raw.encode("ascii"),
                      headers={"content-type": "application/json"}, timeout=60)


def _error(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == (400, "BadRequestError", param), err
    return str(err["message"])


# (path, raw JSON body, param, character index of the surrogate)
SURROGATES = [
    ("completions", r'{"prompt": "a\ud800b"}', "prompt", 1),
    ("completions", r'{"prompt": ["ok", "xy\udfff"]}', "prompt.1", 2),
    ("completions", r'{"prompt": "a", "stop": ["fine", "\udc00"]}', "stop.1", 0),
    ("completions", r'{"prompt": "a", "cache_salt": "s\ud800"}', "cache_salt", 1),
    ("chat/completions", r'{"messages": [{"role": "user", "content": "a\ud800b"}]}',
     "messages.0.content", 1),
    ("chat/completions", r'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", '
     r'"content": [{"type": "text", "text": "\udbff!"}]}]}', "messages.1.content.0.text", 0),
    ("chat/completions", r'{"messages": [{"role": "us\ud800er", "content": "hi"}]}',
     "messages.0.role", 2),
    ("chat/completions", r'{"messages": [{"role": "user", "name": "\ud800", "content": "x"}]}',
     "messages.0.name", 0),
]


@pytest.mark.parametrize("path,raw,param,at", SURROGATES, ids=[c[2] for c in SURROGATES])
def test_lone_surrogate_is_400_naming_the_field(
    idle_server: ServerHandle, path: str, raw: str, param: str, at: int
) -> None:
    bad = json.loads(raw)  # the character the server will name
    msg = _error(_post(idle_server, path, raw), param)
    value: Any = bad
    for part in param.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    assert msg.startswith(f"{param}: the string is not valid Unicode: a lone surrogate "
                          f"({value[at]!a}) at character {at};")


def test_surrogate_pair_and_bad_key(idle_server: ServerHandle) -> None:
    ok = _post(idle_server, "completions",
               r'{"prompt": "a\ud83d\ude00b", "max_tokens": 1, "temperature": 0}')
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1
    msg = _error(_post(idle_server, "completions", r'{"prompt": "a", "x\ud800": 1}'), None)
    assert msg.startswith("the request body: the key 'x\\ud800' is not valid Unicode")


# Every field of both request models (numeric or not) and nested ones.
FIELDS = sorted(set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields))
SPELLINGS = {"Infinity": "Infinity", "-Infinity": "-Infinity", "NaN": "NaN", "1e400": "Infinity",
             "-1e999": "-Infinity"}


def test_non_finite_numbers_are_refused_in_every_field(idle_server: ServerHandle) -> None:
    assert {"temperature", "top_p", "presence_penalty", "frequency_penalty", "max_tokens",
            "seed", "n", "top_k", "min_tokens", "priority", "min_p"} <= set(FIELDS)
    checked = 0
    for path, model, base in (("completions", CompletionRequest, '"prompt": "a"'),
                              ("chat/completions", ChatCompletionRequest,
                               f'"messages": {json.dumps(CHAT)}')):
        for name in FIELDS:
            if name not in model.model_fields:
                continue
            for raw_value, shown in SPELLINGS.items():
                others = "" if name in ("prompt", "messages") else base + ", "
                r = _post(idle_server, path, f'{{{others}"{name}": {raw_value}}}')
                msg = _error(r, name)
                assert msg == (f"{name}: must be a finite number; Infinity, -Infinity and NaN "
                               f"are not allowed (got {shown})"), (path, name, raw_value)
                checked += 1
    assert checked == 5 * (len(CompletionRequest.model_fields)
                           + len(ChatCompletionRequest.model_fields))
    nested = [
        ("completions", '{"prompt": "a", "stream": true, "stream_options": '
                        '{"include_usage": NaN}}', "stream_options.include_usage"),
        ("completions", '{"prompt": [1, 2, Infinity]}', "prompt.2"),
        ("chat/completions", '{"messages": [{"role": "user", "content": -Infinity}]}',
         "messages.0.content"),
        ("completions", '{"prompt": "a", "logit_bias": {"5": NaN}}', "logit_bias.5"),
    ]
    for path, raw, param in nested:
        assert "must be a finite number" in _error(_post(idle_server, path, raw), param)


def test_token_ids_outside_the_vocabulary_name_the_field(idle_server: ServerHandle) -> None:
    vocab = idle_server.engine.engine.vocab_size
    r = _post(idle_server, "completions", json.dumps(
        {"prompt": "a", "stop_token_ids": [5, vocab], "min_tokens": 2, "max_tokens": 4}))
    assert f"({vocab})" in _error(r, "stop_token_ids")
    r = _post(idle_server, "completions", json.dumps({"prompt": [1, vocab + 7]}))
    assert f"token id {vocab + 7} is out of range; allowed 0..{vocab - 1}" in _error(r, "prompt")
    r = _post(idle_server, "chat/completions", json.dumps(
        {"messages": CHAT, "stop_token_ids": [-1]}))
    assert "stop_token_ids" in _error(r, "stop_token_ids")


def test_arrays_past_the_cap_are_refused_before_validation(idle_server: ServerHandle) -> None:
    cap = idle_server.app.state.serving.max_items
    assert cap == max(idle_server.engine.engine.max_model_len, 1 << 16)
    r = _post(idle_server, "completions", json.dumps({"prompt": [1] * (cap + 1)}))
    assert _error(r, "prompt") == (f"prompt: the list has {cap + 1} items; at most {cap} are "
                                   "allowed")


def test_check_json_values_reports_in_document_order_and_survives_deep_nesting() -> None:
    with pytest.raises(BadValue) as e:
        check_json_values({"a": [1.0, float("nan")], "b": float("inf")})
    assert e.value.param == "a.1"
    deep: Any = "ok"
    for _ in range(100_000):  # far past the recursion limit: the walk is iterative
        deep = [deep]
    check_json_values({"x": deep})
    deep_bad: Any = "\ud800"
    for _ in range(100_000):
        deep_bad = {"k": deep_bad}
    with pytest.raises(BadValue) as e:
        check_json_values(deep_bad)
    assert e.value.param == ".".join(["k"] * 100_000)
