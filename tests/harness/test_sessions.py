"""Session fixtures (multi_turn_chat, long_doc_qa): exact counts and lengths, token-exact
prefix sharing, seeded think times and order, checksums, JSONL round trips, clear errors."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fakes import encode, jsonl_error
from workbench.harness.lengths import LengthDist
from workbench.harness.workload_base import _Text
from workbench.harness.workloads import (
    FIXTURES,
    BenchRequest,
    Workload,
    fixture_params,
    load_jsonl,
    make_workload,
    save_jsonl,
)

_encode = encode


CHAT = dict(num_users=3, num_turns=4, system_prompt_len=20,
            first_message_len={"kind": "uniform", "low": 10, "high": 30},
            message_len={"kind": "uniform", "low": 4, "high": 12},
            answer_len={"kind": "uniform", "low": 3, "high": 9}, think_time_s=2.0)


# ---- multi_turn_chat --------------------------------------------------------------------


def test_multi_turn_chat_shape_and_exact_prefixes(tokenizer: Any) -> None:
    w = make_workload("multi_turn_chat", 7, tokenizer, **CHAT)
    assert "multi_turn_chat" in FIXTURES and len(w.requests) == 12
    assert [r.request_id for r in w.requests[:5]] == [
        "multi_turn_chat-u0000-t000", "multi_turn_chat-u0000-t001",
        "multi_turn_chat-u0000-t002", "multi_turn_chat-u0000-t003",
        "multi_turn_chat-u0001-t000"]
    system = w.requests[0].prompt_token_ids[:20]
    for u in range(3):
        turns = w.requests[4 * u:4 * u + 4]
        assert [r.group for r in turns] == [f"session-{u}"] * 4
        assert [r.turn for r in turns] == [0, 1, 2, 3]
        assert [r.follows for r in turns] == [None] + [r.request_id for r in turns[:3]]
        assert turns[0].arrival_s == 0.0 and all(r.arrival_s is None for r in turns[1:])
        assert turns[0].think_s == 0.0 and all(r.think_s > 0 for r in turns[1:])
        assert turns[0].prompt_token_ids[:20] == system  # one system prompt for all users
        assert 30 <= len(turns[0].prompt_token_ids) <= 50
        for prev, nxt in zip(turns, turns[1:], strict=False):
            ids, more = prev.prompt_token_ids, nxt.prompt_token_ids
            assert more[:len(ids)] == ids  # the whole history, token for token
            # + the synthetic answer of max_tokens tokens + the next message (4..12)
            assert 4 <= len(more) - len(ids) - prev.max_tokens <= 12
            assert nxt.prompt.startswith(prev.prompt)  # the text is a prefix too
        for r in turns:
            assert 3 <= r.max_tokens <= 9
            assert _encode(tokenizer, r.prompt) == r.prompt_token_ids  # re-tokenizes exactly
    firsts = [w.requests[4 * u].prompt_token_ids for u in range(3)]
    assert len({tuple(f[20:]) for f in firsts}) == 3  # each user's first message differs


def test_multi_turn_chat_replays_its_draw_order(tokenizer: Any) -> None:
    """The documented order: system text, (starts), then per user its lengths, think times,
    text. Replayed here for user 0."""
    w = make_workload("multi_turn_chat", 3, tokenizer, **CHAT)
    rng, text = random.Random(3), _Text(tokenizer)
    text.ids(rng, 20)
    first = LengthDist.from_dict(CHAT["first_message_len"]).sample(rng, 1)[0]
    msgs = LengthDist.from_dict(CHAT["message_len"]).sample(rng, 3)
    answers = LengthDist.from_dict(CHAT["answer_len"]).sample(rng, 4)
    thinks = [rng.expovariate(1 / 2.0) for _ in range(3)]
    u0 = w.requests[:4]
    assert [r.max_tokens for r in u0] == answers
    assert [r.think_s for r in u0] == [0.0, *thinks]
    lens = [20 + first]
    for t in range(3):
        lens.append(lens[-1] + answers[t] + msgs[t])
    assert [len(r.prompt_token_ids) for r in u0] == lens


def test_multi_turn_chat_think_times_and_session_starts(tokenizer: Any) -> None:
    base = dict(num_users=100, num_turns=3, system_prompt_len=0, first_message_len=4,
                message_len=2, answer_len=2, think_time_s=1.5)
    fixed = make_workload("multi_turn_chat", 0, tokenizer, **base, think_time_dist="fixed")
    assert {r.think_s for r in fixed.requests if r.follows} == {1.5}
    uni = make_workload("multi_turn_chat", 0, tokenizer, **base, think_time_dist="uniform")
    ts = [r.think_s for r in uni.requests if r.follows]
    assert len(ts) == 200 and 0 <= min(ts) and max(ts) <= 3.0
    assert sum(ts) / 200 == pytest.approx(1.5, rel=0.1)
    exp = make_workload("multi_turn_chat", 0, tokenizer, **base)
    ts = [r.think_s for r in exp.requests if r.follows]
    assert sum(ts) / 200 == pytest.approx(1.5, rel=0.15) and max(ts) > 3.0  # a tail
    zero = make_workload("multi_turn_chat", 0, tokenizer, **{**base, "think_time_s": 0})
    assert {r.think_s for r in zero.requests} == {0.0}
    spread = make_workload("multi_turn_chat", 0, tokenizer, **base, session_start_spread_s=10)
    starts = [r.arrival_s for r in spread.requests if r.turn == 0]
    assert starts == sorted(starts) and starts[0] == 0.0 and 9 < starts[-1] <= 10
    assert len(set(starts)) == 100


def test_multi_turn_chat_checksum(tokenizer: Any) -> None:
    a = make_workload("multi_turn_chat", 0, tokenizer)
    b = make_workload("multi_turn_chat", 0, tokenizer)
    assert a.checksum == b.checksum and a.requests == b.requests and len(a.requests) == 16
    assert a.params["answer_len"] == {"kind": "uniform", "low": 8, "high": 32}
    seen = {a.checksum, make_workload("multi_turn_chat", 1, tokenizer).checksum}
    for change in [{"num_users": 5}, {"num_turns": 3}, {"system_prompt_len": 31},
                   {"think_time_s": 0.25}, {"think_time_dist": "uniform"},
                   {"session_start_spread_s": 2.0}, {"answer_len": 9}, {"message_len": 9},
                   {"first_message_len": 40}]:
        seen.add(make_workload("multi_turn_chat", 0, tokenizer, **change).checksum)
    assert len(seen) == 11


@pytest.mark.parametrize(("params", "msg"), [
    ({"num_user": 2}, "fixture 'multi_turn_chat' got unknown params ['num_user']; allowed: "
                      "['answer_len', 'first_message_len', 'max_model_len', 'message_len', "
                      "'num_turns', 'num_users', 'session_start_spread_s', "
                      "'system_prompt_len', 'think_time_dist', 'think_time_s']"),
    ({"num_users": 0}, "num_users (0) must be an integer >= 1"),
    ({"num_turns": 1.5}, "num_turns (1.5) must be an integer >= 1"),
    ({"system_prompt_len": -1}, "system_prompt_len (-1) must be an integer >= 0"),
    ({"think_time_s": -1}, "think_time_s (-1) must be a finite number of seconds >= 0"),
    ({"session_start_spread_s": float("inf")}, "session_start_spread_s (inf) must be"),
    ({"think_time_dist": "gauss"},
     "think_time_dist ('gauss') must be one of ['exponential', 'uniform', 'fixed']"),
    ({"message_len": {"kind": "lognormal", "p50": 8, "p95": 32}},
     "message_len ({'kind': 'lognormal', 'p50': 8, 'p95': 32}) is unbounded; give it a max"),
    ({"answer_len": {"kind": "uniform", "low": 9}},
     "answer_len: LengthDist(kind='uniform') needs low and high; high is missing"),
    ({"num_turns": 20}, "the longest session needs 1344 tokens (system_prompt_len 32 + "
                        "first_message_len up to 64 + 19 x (answer_len up to 32 + message_len "
                        "up to 32) + the last answer up to 32), more than max_model_len "
                        "(1024); lower num_turns"),
])
def test_multi_turn_chat_errors(tokenizer: Any, params: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError) as e:
        make_workload("multi_turn_chat", 0, tokenizer, **params)
    assert msg in str(e.value)


def test_lognormal_with_a_max_is_accepted(tokenizer: Any) -> None:
    w = make_workload("multi_turn_chat", 0, tokenizer, num_turns=2,
                      message_len={"kind": "lognormal", "p50": 8, "p95": 32, "max": 40})
    assert w.params["message_len"]["max"] == 40 and len(w.requests) == 8


# ---- long_doc_qa ------------------------------------------------------------------------


DOCS = dict(num_documents=3, document_len=100, questions_per_document=4,
            question_len={"kind": "uniform", "low": 5, "high": 15}, answer_len=6)


@pytest.mark.parametrize("order", ["grouped", "interleaved", "random"])
def test_long_doc_qa_shape_and_order(tokenizer: Any, order: str) -> None:
    w = make_workload("long_doc_qa", 2, tokenizer, **DOCS, order=order)
    assert len(w.requests) == 12 and {r.max_tokens for r in w.requests} == {6}
    pairs = [(int(r.request_id[-8:-5]), int(r.request_id[-3:])) for r in w.requests]
    assert sorted(pairs) == [(d, q) for d in range(3) for q in range(4)]
    if order == "grouped":
        assert pairs == [(d, q) for d in range(3) for q in range(4)]
    elif order == "interleaved":
        assert pairs == [(d, q) for q in range(4) for d in range(3)]
    else:
        rng, text = random.Random(2), _Text(tokenizer)  # replay the draws, then shuffle
        qlens = LengthDist.from_dict(DOCS["question_len"]).sample(rng, 12)
        LengthDist.from_dict(6).sample(rng, 12)
        for n in [100] * 3 + qlens:
            text.ids(rng, n)
        shuffled = [(d, q) for d in range(3) for q in range(4)]
        rng.shuffle(shuffled)
        assert pairs == shuffled
    docs: dict[str, set[tuple[int, ...]]] = {}
    for r, (d, _) in zip(w.requests, pairs, strict=True):
        assert r.group == f"document-{d}"
        assert 105 <= len(r.prompt_token_ids) <= 115
        docs.setdefault(r.group, set()).add(tuple(r.prompt_token_ids[:100]))
        assert _encode(tokenizer, r.prompt) == r.prompt_token_ids
        assert r.follows is None and r.arrival_s is None
    assert all(len(v) == 1 for v in docs.values())  # one document per group, token-exact
    firsts = [next(iter(v)) for v in docs.values()]
    assert len({f[:16] for f in firsts}) == 3  # the documents differ from their first block


def test_long_doc_qa_checksum_and_errors(tokenizer: Any) -> None:
    a = make_workload("long_doc_qa", 0, tokenizer)
    assert a.checksum == make_workload("long_doc_qa", 0, tokenizer).checksum
    assert len(a.requests) == 16 and len(a.requests[0].prompt_token_ids) >= 520
    seen = {a.checksum}
    for change in [{"order": "grouped"}, {"num_documents": 3}, {"document_len": 500},
                   {"questions_per_document": 5}, {"answer_len": 7}, {"question_len": 9}]:
        seen.add(make_workload("long_doc_qa", 0, tokenizer, **change).checksum)
    assert len(seen) == 7
    with pytest.raises(ValueError, match=r"order \('tile'\) must be one of \['random', "
                                         r"'grouped', 'interleaved'\]"):
        make_workload("long_doc_qa", 0, tokenizer, order="tile")
    with pytest.raises(ValueError, match=r"document_len \(1000\) \+ question_len up to 32 \+ "
                                         r"answer_len up to 32 is more than max_model_len"):
        make_workload("long_doc_qa", 0, tokenizer, document_len=1000)
    with pytest.raises(ValueError, match=r"questions_per_document \(0\) must be an integer"):
        make_workload("long_doc_qa", 0, tokenizer, questions_per_document=0)
    with pytest.raises(ValueError, match=r"unknown params \['output_len'\]"):
        make_workload("long_doc_qa", 0, tokenizer, output_len=3)


def test_fixture_params_cover_every_fixture() -> None:
    assert fixture_params("long_doc_qa") == (
        "answer_len", "document_len", "max_model_len", "num_documents", "order",
        "question_len", "questions_per_document")
    assert "num_requests" in fixture_params("balanced-chat")
    assert all(fixture_params(name) for name in FIXTURES)
    with pytest.raises(ValueError, match="must be one of"):
        fixture_params("chat")


# ---- checksum, BenchRequest and JSONL ---------------------------------------------------


def test_old_workloads_keep_their_checksum(tokenizer: Any) -> None:
    """The dependency fields enter the checksum only when set: a workload without them
    hashes exactly the four fields it always did."""
    w = make_workload("shared-prefix", 0, tokenizer, num_requests=6)
    rows = [{"request_id": r.request_id, "prompt_token_ids": r.prompt_token_ids,
             "max_tokens": r.max_tokens, "arrival_s": r.arrival_s} for r in w.requests]
    blob = json.dumps(rows, separators=(",", ":"), sort_keys=True)
    assert w.checksum == hashlib.sha256(blob.encode()).hexdigest()
    reqs = (BenchRequest("a", [1], 2), BenchRequest("b", [1, 3], 2, follows="a", think_s=1.0))
    base = Workload("x", 0, {}, reqs).checksum
    for changed in [BenchRequest("b", [1, 3], 2, follows="a", think_s=1.5),
                    BenchRequest("b", [1, 3], 2, follows="a", think_s=1.0, turn=1),
                    BenchRequest("b", [1, 3], 2)]:
        assert Workload("x", 0, {}, (reqs[0], changed)).checksum != base


@pytest.mark.parametrize(("kw", "msg"), [
    ({"follows": ""}, "follows ('') must be another request's id"),
    ({"follows": "r"}, "follows ('r') must be another request's id"),
    ({"follows": "a", "think_s": -1.0}, "think_s (-1.0) must be a finite number >= 0"),
    ({"think_s": 1.0}, "think_s (1.0) needs follows"),
    ({"turn": -1}, "turn (-1) must be an integer >= 0"),
])
def test_bench_request_checks_its_dependency(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError) as e:
        BenchRequest("r", [1], 2, **kw)
    assert msg in str(e.value) and "request 'r'" in str(e.value)


def test_jsonl_round_trip_keeps_follows_think_and_turn(tokenizer: Any, tmp_path: Path) -> None:
    w = make_workload("multi_turn_chat", 0, tokenizer, session_start_spread_s=1.0)
    path = save_jsonl(w, tmp_path / "chat.jsonl")
    back = load_jsonl(path, tokenizer)
    assert back.checksum == w.checksum and back.requests == w.requests
    row = json.loads(path.read_text().splitlines()[1])
    assert row["follows"] == w.requests[0].request_id and row["turn"] == 1
    assert row["think_s"] == w.requests[1].think_s and "arrival_s" not in row
    docs = make_workload("long_doc_qa", 0, tokenizer)
    assert load_jsonl(save_jsonl(docs, tmp_path / "d.jsonl")).checksum == docs.checksum


@pytest.mark.parametrize(("line", "msg"), [
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": "zz"}',
     "line 2: follows ('zz') names no earlier line's request_id"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": "b", "request_id": "b"}',
     "line 2: follows ('b') names no earlier line's request_id"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": 3}',
     "line 2: follows (3) must be a non-empty string"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "think_s": 1}',
     "line 2: think_s (1) needs follows"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": "a", "think_s": -2}',
     "line 2: think_s (-2) must be a finite number >= 0"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": "a", "think_s": true}',
     "line 2: think_s (True) must be"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "follows": "a", "arrival_s": 2}',
     "line 2: arrival_s (2) and follows ('a') exclude each other"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "turn": -1}',
     "line 2: turn (-1) must be an integer >= 0"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "session": 1}',
     "line 2: ['session'] unknown; allowed fields: ['request_id', 'prompt', "
     "'prompt_token_ids', 'max_tokens', 'arrival_s', 'group', 'follows', 'think_s', 'turn']"),
])
def test_jsonl_dependency_errors_name_line_and_field(tmp_path: Path, line: str, msg: str
                                                     ) -> None:
    assert msg in jsonl_error(tmp_path, line)


def test_jsonl_follow_up_line(tmp_path: Path) -> None:
    p = tmp_path / "chat.jsonl"
    p.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 3, "request_id": "a", '
                 '"group": "s0", "turn": 0, "arrival_s": 0.5}\n'
                 '{"prompt_token_ids": [1, 2, 7], "max_tokens": 3, "follows": "a", '
                 '"think_s": 2, "turn": 1}\n')
    w = load_jsonl(p)
    assert w.requests[1] == BenchRequest("chat-00001", [1, 2, 7], 3, follows="a",
                                         think_s=2.0, turn=1)
    assert w.requests[0].turn == 0 and w.requests[0].arrival_s == 0.5
