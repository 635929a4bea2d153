"""Workloads replay exactly: seeded lengths follow their stated distributions, fixtures have
the shapes they claim, and JSONL files round-trip with clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fakes import encode, jsonl_error
from workbench.harness.lengths import LengthDist
from workbench.harness.workloads import (
    FIXTURES,
    REPEAT_HEADER,
    BenchRequest,
    Workload,
    load_jsonl,
    make_workload,
    save_jsonl,
)

_encode = encode


# ---- LengthDist -------------------------------------------------------------------------


def test_lognormal_quantiles_match_stated() -> None:
    d = LengthDist(kind="lognormal", p50=256, p95=1024)
    xs = sorted(d.sample(random.Random(0), 10_000))
    assert xs[5_000] == pytest.approx(256, rel=0.03)
    assert xs[9_500] == pytest.approx(1024, rel=0.04)
    desc = d.describe()
    assert desc["p50"] == pytest.approx(256) and desc["p95"] == pytest.approx(1024)
    assert desc["dist"] == {"kind": "lognormal", "p50": 256, "p95": 1024}


def test_length_dist_kinds_and_clamp() -> None:
    assert LengthDist.from_dict(7).sample(random.Random(0), 3) == [7, 7, 7]
    u = LengthDist.from_dict({"kind": "uniform", "low": 3, "high": 5})
    assert set(u.sample(random.Random(1), 200)) == {3, 4, 5}
    c = LengthDist(kind="lognormal", p50=100, p95=400, min=50, max=120)
    xs = c.sample(random.Random(2), 1000)
    assert min(xs) == 50 and max(xs) == 120
    assert c.describe()["p95"] == 120.0  # the clamp applies to the stated quantiles too
    assert LengthDist.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(("d", "msg"), [
    ({"kind": "normal"}, "kind ('normal')"),
    ({"kind": "uniform", "low": 5}, "high is missing"),
    ({"kind": "uniform", "low": 5, "high": 4}, "high (4) must be >= low (5)"),
    ({"kind": "lognormal", "p50": 100, "p95": 90}, "p95 (90) must be > p50 (100)"),
    ({"kind": "fixed", "value": 8, "p50": 3}, "not p50"),
    ({"kind": "fixed", "value": 0}, "value (0)"),
    ({"kind": "fixed", "value": 8, "max": 4}, "value (8) lies outside [min, max] = [1, 4]"),
    ({"kind": "uniform", "low": 8, "high": 9, "max": 4}, "does not meet [min, max]"),
    ({"kind": "uniform", "low": 8, "high": 9, "min": 5, "max": 4}, "max (4)"),
    ({"value": 8}, "needs 'kind'"),
    ({"kind": "fixed", "vlaue": 8}, "unknown keys ['vlaue']"),
    ("8", "must be an int or a dict"),
])
def test_length_dist_errors(d: Any, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        LengthDist.from_dict(d)
    assert msg in str(e.value)


# ---- fixtures ---------------------------------------------------------------------------


def _replay_lengths(w: Workload, key: str) -> tuple[list[int], list[int]]:
    """The documented draw order: all input (or suffix) lengths, then all output lengths."""
    rng, n = random.Random(w.seed), len(w.requests)
    return (LengthDist.from_dict(w.params[key]).sample(rng, n),
            LengthDist.from_dict(w.params["output_len"]).sample(rng, n))


def test_same_seed_same_workload_pinned_lengths(tokenizer: Any) -> None:
    a = make_workload("balanced-chat", 0, tokenizer)
    b = make_workload("balanced-chat", 0, tokenizer)
    assert a.checksum == b.checksum and a.requests == b.requests
    # Pinned: random.Random(0) lognormal draws (p50 64, p95 256 in; p50 32, p95 128 out).
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in a.requests[:3]] == FIRST_THREE
    assert make_workload("balanced-chat", 1, tokenizer).checksum != a.checksum
    assert make_workload("balanced-chat", 0, tokenizer, num_requests=31).checksum != a.checksum
    for name in FIXTURES:
        assert (make_workload(name, 3, tokenizer).checksum
                == FIXTURES[name](3, tokenizer).checksum)


FIRST_THREE = [(55, 129), (66, 150), (115, 26)]


@pytest.mark.parametrize("name", ["balanced-chat", "long-prefill", "long-decode"])
def test_io_fixture_lengths_follow_the_distribution(tokenizer: Any, name: str) -> None:
    w = make_workload(name, 5, tokenizer, num_requests=40)
    ins, outs = _replay_lengths(w, "input_len")
    assert [len(r.prompt_token_ids) for r in w.requests] == ins
    assert [r.max_tokens for r in w.requests] == outs
    assert all(i + o <= w.params["max_model_len"] for i, o in zip(ins, outs, strict=True))
    assert all(i <= w.params["max_input_len"] for i in ins)
    for r in w.requests:  # text is the decode of the ids, and re-encodes to them
        assert r.prompt == tokenizer.decode(r.prompt_token_ids)
        assert _encode(tokenizer, r.prompt) == r.prompt_token_ids
    assert len({r.request_id for r in w.requests}) == 40


def test_caps_clamp_lognormal_and_reject_what_cannot_fit(tokenizer: Any) -> None:
    w = make_workload("balanced-chat", 0, tokenizer, num_requests=64, max_input_len=80,
                      max_model_len=120)
    assert w.params["input_len"]["max"] == 80 and w.params["output_len"]["max"] == 40
    assert max(len(r.prompt_token_ids) for r in w.requests) == 80
    with pytest.raises(ValueError, match=r"input_len .* exceeds max_input_len \(512\)"):
        make_workload("balanced-chat", 0, tokenizer, input_len=600)
    with pytest.raises(ValueError, match=r"max_input_len \(1024\) must be < max_model_len"):
        make_workload("long-decode", 0, tokenizer, max_input_len=1024)
    with pytest.raises(ValueError, match=r"unknown params \['input_length'\]"):
        make_workload("long-decode", 0, tokenizer, input_length=8)
    with pytest.raises(ValueError, match=r"output_len: LengthDist p95 \(10\) must be > p50"):
        make_workload("long-decode", 0, tokenizer, output_len={"kind": "lognormal", "p50": 20,
                                                               "p95": 10})
    with pytest.raises(ValueError, match="must be one of"):
        make_workload("chat", 0, tokenizer)


def test_fixed_lengths_and_summary(tokenizer: Any) -> None:
    w = make_workload("long-prefill", 0, tokenizer, num_requests=4, input_len=100,
                      output_len={"kind": "fixed", "value": 9})
    s = w.summary()
    assert (s["num_requests"], s["total_input_tokens"], s["total_output_tokens"]) == (4, 400, 36)
    assert (s["input_len_p50"], s["input_len_p95"], s["output_len_p95"]) == (100, 100, 9)
    assert s["checksum"] == w.checksum and s["params"]["input_len"] == {"kind": "fixed",
                                                                        "value": 100}
    json.dumps(s)  # JSON-serialisable


def test_shared_prefix_groups_share_prefix(tokenizer: Any) -> None:
    w = make_workload("shared-prefix", 2, tokenizer, num_requests=12, num_prefix_groups=3,
                      prefix_len=40)
    sufs, outs = _replay_lengths(w, "suffix_len")
    assert [len(r.prompt_token_ids) for r in w.requests] == [40 + s for s in sufs]
    assert [r.max_tokens for r in w.requests] == outs
    assert [r.group for r in w.requests] == [f"prefix-{i % 3}" for i in range(12)]
    prefixes = {g: {tuple(r.prompt_token_ids[:40]) for r in w.requests if r.group == g}
                for g in ("prefix-0", "prefix-1", "prefix-2")}
    assert all(len(p) == 1 for p in prefixes.values())  # one prefix per group
    assert len(set().union(*prefixes.values())) == 3  # and the groups differ
    suffixes = [tuple(r.prompt_token_ids[40:]) for r in w.requests]
    assert len(set(suffixes)) == 12


def test_repetitive_prompts_repeat_the_text(tokenizer: Any) -> None:
    w = make_workload("repetitive", 0, tokenizer, num_requests=10)
    ins = LengthDist.from_dict(w.params["input_len"]).sample(random.Random(0), 10)
    assert [len(r.prompt_token_ids) for r in w.requests] == ins
    head, sep = _encode(tokenizer, REPEAT_HEADER), _encode(tokenizer, "\n")
    for r in w.requests:
        ids = r.prompt_token_ids
        m = (len(ids) - len(head) - len(sep)) // 2
        body = ids[len(head):len(head) + m]
        assert ids[:len(head)] == head
        assert ids[len(head) + m + len(sep):len(head) + 2 * m + len(sep)] == body
        assert r.max_tokens == m  # output_len None: exactly the text's length
        text = tokenizer.decode(body)
        assert r.prompt.startswith(REPEAT_HEADER) and r.prompt.count(text) == 2
    with pytest.raises(ValueError, match="shortest repeat prompt"):
        make_workload("repetitive", 0, tokenizer, input_len=4)
    w2 = make_workload("repetitive", 0, tokenizer, num_requests=10, output_len=7)
    assert {r.max_tokens for r in w2.requests} == {7}


# ---- JSONL ------------------------------------------------------------------------------


def test_jsonl_round_trip(tokenizer: Any, tmp_path: Path) -> None:
    w = make_workload("shared-prefix", 0, tokenizer, num_requests=6)
    back = load_jsonl(save_jsonl(w, tmp_path / "w.jsonl"), tokenizer)
    assert back.checksum == w.checksum and back.requests == w.requests
    assert back.name == "w" and len(back.params["file_sha256"]) == 64


def test_jsonl_text_prompts_and_arrivals(tokenizer: Any, tmp_path: Path) -> None:
    p = tmp_path / "trace.jsonl"
    p.write_text('{"prompt": "the cache", "max_tokens": 4, "arrival_s": 0}\n\n'
                 '{"prompt_token_ids": [5, 6, 7], "max_tokens": 2, "arrival_s": 1.5, '
                 '"request_id": "b"}\n')
    w = load_jsonl(p, tokenizer, name="t")
    assert w.requests[0] == BenchRequest("t-00000", _encode(tokenizer, "the cache"), 4,
                                         prompt="the cache", arrival_s=0.0)
    assert w.requests[1] == BenchRequest("b", [5, 6, 7], 2, arrival_s=1.5)
    assert load_jsonl(p, tokenizer, name="t").checksum == w.checksum
    with pytest.raises(ValueError, match="JSONL line 1: prompt is text but no tokenizer"):
        load_jsonl(p)


@pytest.mark.parametrize(("line", "msg"), [
    ('{"prompt_token_ids": [1], "max_tokens": 0}', "line 2: max_tokens (0)"),
    ('{"prompt_token_ids": [1]}', "line 2: max_tokens (None)"),
    ('{"max_tokens": 3}', "line 2: prompt or prompt_token_ids is required"),
    ('{"prompt_token_ids": [], "max_tokens": 3}', "line 2: prompt_token_ids must be"),
    ('{"prompt_token_ids": [1, "a"], "max_tokens": 3}', "line 2: prompt_token_ids must be"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "arrival_s": -1}', "line 2: arrival_s (-1)"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "arrival_s": 0.5}', "before the previous"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "request_id": "a"}', "'a') is a duplicate"),
    ('{"prompt_token_ids": [1], "max_tokens": 3, "temp": 1}', "line 2: ['temp'] unknown"),
    ('{"prompt_token_ids": [1], "max_tokens": 3', "line 2: line is not valid JSON"),
    ("[1, 2]", "line 2: line must be a JSON object"),
])
def test_jsonl_errors_name_line_and_field(tmp_path: Path, line: str, msg: str) -> None:
    assert msg in jsonl_error(tmp_path, line)


def test_jsonl_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no requests"):
        load_jsonl(tmp_path / "e.jsonl")
