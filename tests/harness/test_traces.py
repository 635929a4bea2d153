"""Trace readers replay the field's formats exactly: recorded lengths become prompt and
output token counts, timestamps become arrival_s (scaled), Mooncake hash ids share exactly
their blocks' token ids, drops are counted, and a bad file gets one sentence naming the file,
the line, the field, the value and what is allowed. Plus: the shipped samples are what
samples.py writes, and templates take `workload: {trace: ..., format: ...}`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fakes import encode
from workbench.errors import UserError
from workbench.harness.traces import FORMATS, load_trace, trace_params
from workbench.harness.traces.samples import FILES, SAMPLES_DIR, write_samples

BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _error(fmt: str, path: Path, **kw: Any) -> str:
    with pytest.raises(UserError) as e:
        load_trace(fmt, path, **kw)
    return str(e.value)


def _lens(w: Any) -> list[tuple[int, int]]:
    return [(len(r.prompt_token_ids), r.max_tokens) for r in w.requests]


# ---- BurstGPT ---------------------------------------------------------------------------


def _burst(tmp_path: Path) -> Path:
    return _write(tmp_path, "b.csv", BURST_HEAD +
                  "5,ChatGPT,472,18,490,Conversation log\n"
                  "5,GPT-4,30,0,30,Conversation log\n"
                  "9,GPT-4,417,276,693,API log\n"
                  "13.5,ChatGPT,37,160,197,Conversation log\n")


def test_burstgpt_lengths_arrivals_and_failed_rows(tmp_path: Path) -> None:
    w = load_trace("burstgpt", _burst(tmp_path), rate_scale=2.0)
    assert _lens(w) == [(472, 18), (417, 276), (37, 160)]
    assert [r.arrival_s for r in w.requests] == [0.0, 2.0, 4.25]
    assert [r.request_id for r in w.requests] == ["b-00000", "b-00001", "b-00002"]
    assert w.params["dropped"] == {"no_output": 1} and w.params["records_read"] == 4
    assert w.params["format"] == "burstgpt" and w.params["rate_scale"] == 2.0
    assert all(0 <= t < 32000 for r in w.requests for t in r.prompt_token_ids)
    assert all(r.prompt is None for r in w.requests)  # no tokenizer: ids only


def test_burstgpt_model_and_log_type_filters(tmp_path: Path) -> None:
    w = load_trace("burstgpt", _burst(tmp_path), model="GPT-4")
    assert _lens(w) == [(417, 276)]
    assert w.params["dropped"] == {"no_output": 1}
    w = load_trace("burstgpt", _burst(tmp_path), log_type="Conversation log")
    assert _lens(w) == [(472, 18), (37, 160)]
    assert [r.arrival_s for r in w.requests] == [0.0, 8.5]


def test_synthetic_prompts_are_deterministic_and_per_record(tmp_path: Path) -> None:
    p = _burst(tmp_path)
    a, b = load_trace("burstgpt", p, seed=3), load_trace("burstgpt", p, seed=3)
    assert a.checksum == b.checksum
    assert load_trace("burstgpt", p, seed=4).checksum != a.checksum
    # record 3's tokens are its own whichever records are kept before it
    late = load_trace("burstgpt", p, seed=3, start_s=5)
    assert late.requests[-1].prompt_token_ids == a.requests[-1].prompt_token_ids
    assert [r.arrival_s for r in late.requests] == [3.5]  # from the window's start, 5 + 5 s
    vocab = load_trace("burstgpt", p, vocab_size=10)
    assert {t for r in vocab.requests for t in r.prompt_token_ids} <= set(range(10))


def test_window_max_requests_and_max_model_len(tmp_path: Path) -> None:
    p = _burst(tmp_path)
    w = load_trace("burstgpt", p, start_s=0, duration_s=4.0)
    assert _lens(w) == [(472, 18)] and w.params["records_read"] == 3
    assert _lens(load_trace("burstgpt", p, max_requests=2)) == [(472, 18), (417, 276)]
    w = load_trace("burstgpt", p, max_model_len=500)
    assert _lens(w) == [(472, 18), (37, 160)]
    assert w.params["dropped"] == {"no_output": 1, "over_max_model_len": 1}
    assert _error("burstgpt", p, max_model_len=100) == (
        f"{p}: no request left to replay (4 records read, dropped: {{'no_output': 1, "
        "'over_max_model_len': 3}); widen the window (start_s, duration_s) or raise "
        "max_model_len")


def test_burstgpt_bad_cells(tmp_path: Path) -> None:
    p = _write(tmp_path, "bad.csv", BURST_HEAD + "5,ChatGPT,472,18,490,Conversation log\n"
               "6,ChatGPT,abc,18,490,Conversation log\n")
    assert _error("burstgpt", p) == (f"{p}, line 3: Request tokens ('abc') must be a token "
                                     "count (an integer >= 0)")
    p = _write(tmp_path, "order.csv", BURST_HEAD + "9,ChatGPT,4,18,22,Conversation log\n"
               "6,ChatGPT,4,18,22,Conversation log\n")
    assert _error("burstgpt", p) == (f"{p}, line 3: Timestamp (6.0) is before the previous "
                                     "row's (9.0); sort the file by Timestamp")
    p = _write(tmp_path, "short.csv", BURST_HEAD + "9,ChatGPT,4,18\n")
    assert _error("burstgpt", p) == (f"{p}, line 2: row ('9,ChatGPT,4,18') has 4 cells; the "
                                     "header has 6")
    p = _write(tmp_path, "head.csv", "Timestamp,Model,Request tokens\n5,ChatGPT,4\n")
    assert _error("burstgpt", p) == (
        f"{p}, line 1: the header (Timestamp,Model,Request tokens) lacks Response tokens, "
        "Total tokens, Log Type; a BurstGPT CSV has the columns Timestamp,Model,Request "
        "tokens,Response tokens,Total tokens,Log Type")


# ---- Azure ------------------------------------------------------------------------------


def test_azure_datetimes_become_exact_offsets(tmp_path: Path) -> None:
    p = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:46.6805900,374,44\n"
               "2023-11-16 18:15:47.1805900,396,109\n"
               "2023-11-16 18:15:49.9305900,879,20\n")
    w = load_trace("azure", p, rate_scale=0.5)
    assert _lens(w) == [(374, 44), (396, 109), (879, 20)]
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 6.5]
    p = _write(tmp_path, "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:46.6805900,374,44\nyesterday,3,4\n")
    assert _error("azure", p) == (
        f"{p}, line 3: TIMESTAMP ('yesterday') must be a time: seconds (a number >= 0) or a "
        "date-time such as 2023-11-16 18:15:46.680590, not before the file's first")


# ---- Mooncake ---------------------------------------------------------------------------


def _mooncake(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    return _write(tmp_path, "m.jsonl", "".join(json.dumps(x) + "\n" for x in lines))


def test_mooncake_hash_ids_share_exactly_their_blocks(tmp_path: Path) -> None:
    p = _mooncake(tmp_path, [
        {"timestamp": 0, "input_length": 600, "output_length": 52, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 26, "hash_ids": [0, 1, 2]},
        {"timestamp": 3000, "input_length": 700, "output_length": 8, "hash_ids": [0, 3]},
        {"timestamp": 3000, "input_length": 300, "output_length": 9, "hash_ids": []},
    ])
    w = load_trace("mooncake", p, rate_scale=3.0)
    a, b, c, d = (r.prompt_token_ids for r in w.requests)
    assert _lens(w) == [(600, 52), (1100, 26), (700, 8), (300, 9)]
    assert [r.arrival_s for r in w.requests] == [0.0, 0.5, 1.0, 1.0]
    assert a[:512] == b[:512] == c[:512]  # block 0
    assert a[512:600] == b[512:600]  # block 1, partial in a
    assert b[600:1024] != c[600:1024] and c[512:600] != a[512:600]
    assert len(b[1024:]) == 76 and d != a[:300]
    assert [r.group for r in w.requests] == ["prefix-0", "prefix-0", "prefix-0", None]
    small = load_trace("mooncake", p, block_size=300)
    assert small.requests[0].prompt_token_ids[:300] == small.requests[1].prompt_token_ids[:300]


def test_mooncake_bad_lines(tmp_path: Path) -> None:
    ok: dict[str, Any] = {"timestamp": 10, "input_length": 600, "output_length": 5,
                          "hash_ids": [0, 1]}
    cases: list[tuple[dict[str, Any], str]] = [
        ({**ok, "hash_ids": [0, 1, 2]}, "hash_ids ('3 ids') name more blocks than "
         "input_length 600 needs at block_size 512 (2); set block_size to the trace's block "
         "size"),
        ({**ok, "timestamp": 5}, "timestamp (5) is before the previous line's (10); sort the "
         "file by timestamp"),
        ({**ok, "output_length": 2.5}, "output_length (2.5) must be a token count (an integer "
         ">= 0)"),
        ({**ok, "hash_ids": [0, -1]}, "hash_ids ([0, -1]) must be a list of block ids "
         "(integers >= 0)"),
        ({"timestamp": 10, "output_length": 5}, "input_length (None) is missing; a Mooncake "
         "line has timestamp, input_length, output_length and hash_ids"),
    ]
    for line, why in cases:
        p = _mooncake(tmp_path, [ok, line])
        assert _error("mooncake", p) == f"{p}, line 2: {why}"
    p = _write(tmp_path, "j.jsonl", json.dumps(ok) + "\n{oops\n")
    assert _error("mooncake", p) == (f"{p}, line 2: line ('{{oops') is not valid JSON "
                                     "(Expecting property name enclosed in double quotes)")


# ---- ShareGPT ---------------------------------------------------------------------------


def _conv(i: int, human: str, gpt: str) -> dict[str, Any]:
    return {"id": f"c{i}", "conversations": [{"from": "human", "value": human},
                                             {"from": "gpt", "value": gpt}]}


def test_sharegpt_counts_filters_and_shuffle(tmp_path: Path, tokenizer: Any) -> None:
    long_text = " ".join(["river mountain garden"] * 40)
    convs = [_conv(0, "Tell me about the river and the mountain.", "The river runs past."),
             _conv(1, "Hi", "Hello there, how are you today?"),
             {"id": "c2", "conversations": [{"from": "human", "value": "alone"}]},
             _conv(3, long_text, "A long answer about the garden and the city."),
             _conv(4, "Open the file and read the data.", "Read it with open and read.")]
    p = _write(tmp_path, "s.json", json.dumps(convs))
    w = load_trace("sharegpt", p, tokenizer=tokenizer, shuffle=False, max_prompt_len=64)
    want = [convs[0], convs[4]]
    assert [r.prompt for r in w.requests] == [c["conversations"][0]["value"] for c in want]
    assert [r.prompt_token_ids for r in w.requests] == [
        encode(tokenizer, c["conversations"][0]["value"]) for c in want]
    assert [r.max_tokens for r in w.requests] == [
        len(encode(tokenizer, c["conversations"][1]["value"])) for c in want]
    assert [r.arrival_s for r in w.requests] == [None, None]
    assert w.params["dropped"] == {"too_long": 1, "too_short": 1, "under_two_turns": 1}
    assert w.params["records_read"] == 5
    order = [0, 1, 3, 4]  # the conversations with two turns, shuffled as vLLM does
    random.Random(7).shuffle(order)
    kept = [i for i in order if i in (0, 4)]
    shuffled = load_trace("sharegpt", p, tokenizer=tokenizer, seed=7, max_prompt_len=64)
    assert [r.prompt for r in shuffled.requests] == [
        convs[i]["conversations"][0]["value"] for i in kept]
    assert _error("sharegpt", p) == (f"{p}: a ShareGPT trace is text and needs a tokenizer "
                                     "to count its tokens; give the target's model (or "
                                     "target.tokenizer)")


def test_sharegpt_bad_entries(tmp_path: Path, tokenizer: Any) -> None:
    p = _write(tmp_path, "s.json", json.dumps([_conv(0, "a b c d e", "f g h i j"),
                                               {"id": "x", "conversations": [{"from": "human"},
                                                                             {"value": "y"}]}]))
    assert _error("sharegpt", p, tokenizer=tokenizer) == (
        f"{p}, conversation 1 (id 'x'): conversations[0] ({{'from': 'human'}}) must be "
        "{\"from\": \"human\" | \"gpt\", \"value\": text}")
    p = _write(tmp_path, "d.json", '{"conversations": []}')
    assert _error("sharegpt", p, tokenizer=tokenizer) == (
        f"{p}: a ShareGPT file is a JSON list of {{\"id\", \"conversations\"}} objects, not "
        "a dict")


# ---- options, formats -------------------------------------------------------------------


def test_options_refused_naming_what_is_allowed(tmp_path: Path) -> None:
    p = _burst(tmp_path)
    assert _error("burstgpt", p, rate_scal=2) == (
        "trace format 'burstgpt' has no param 'rate_scal' (did you mean 'rate_scale'?); "
        "allowed: rate_scale, max_requests, start_s, duration_s, max_model_len, vocab_size, "
        "model, log_type")
    assert _error("burstgpt", p, rate_scale=0) == (
        "trace param rate_scale (0) must be a finite number > 0 (2.0 = twice as fast)")
    assert _error("burstgpt", p, max_requests=True) == (
        "trace param max_requests (True) must be an integer >= 1 or null")
    assert _error("burstgp", p) == ("trace format ('burstgp') must be one of sharegpt, "
                                    "burstgpt, azure, mooncake (did you mean 'burstgpt'?)")
    assert _error("azure", tmp_path / "none.csv") == (
        f"trace file ({str(tmp_path / 'none.csv')!r}) is not a file")
    assert trace_params("mooncake") == ("block_size", "duration_s", "max_model_len",
                                        "max_requests", "rate_scale", "start_s", "vocab_size")


def test_shipped_samples_are_what_samples_py_writes(tmp_path: Path, tokenizer: Any) -> None:
    written = write_samples(tmp_path)
    assert sorted(written) == sorted(FORMATS)
    for fmt, name in FILES.items():
        assert (SAMPLES_DIR / name).read_bytes() == written[fmt].read_bytes(), name
        w = load_trace(fmt, SAMPLES_DIR / name, tokenizer=tokenizer)
        assert all(len(r.prompt_token_ids) + r.max_tokens <= 1024 for r in w.requests)
    counts = {fmt: (len(load_trace(fmt, SAMPLES_DIR / n, tokenizer=tokenizer).requests),
                    load_trace(fmt, SAMPLES_DIR / n, tokenizer=tokenizer).params["dropped"])
              for fmt, n in FILES.items()}
    assert counts == {"sharegpt": (14, {"too_short": 1, "under_two_turns": 1}),
                      "burstgpt": (38, {"no_output": 2}), "azure": (40, {}),
                      "mooncake": (40, {})}


# ---- templates --------------------------------------------------------------------------


def _template(workload: dict[str, Any], arrivals: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "question": "q", "workload": workload, "arrivals": arrivals,
            "target": {"kind": "in-process", "model": "bundled"},
            "baseline": {"dtype": "float32", "max_model_len": 1024},
            "variable": {"name": "max_num_seqs", "values": [4]}}


def test_template_trace_workload() -> None:
    from workbench.experiments.replay import build_workload, resolve_model
    from workbench.experiments.template import parse_template
    from workbench.experiments.validate import template_problems

    spec = {"trace": str(SAMPLES_DIR / FILES["mooncake"]), "format": "mooncake", "seed": 0,
            "params": {"rate_scale": 4.0, "max_requests": 6}}
    checked = template_problems(_template(spec, {"mode": "trace"}))
    assert checked.problems == []
    assert len(checked.workload.requests) == 6
    assert checked.workload.requests[1].arrival_s == 0.117 / 4
    t = parse_template(_template(spec, {"mode": "trace"}))
    assert build_workload(t, resolve_model(t.target)).checksum == checked.workload.checksum
    share = {"trace": str(SAMPLES_DIR / FILES["sharegpt"]), "format": "sharegpt"}
    problems = template_problems(_template(share, {"mode": "trace"})).problems
    assert problems == ["arrivals.mode 'trace' replays the workload's arrival_s, but 14 of its "
                        "14 requests have none (a ShareGPT trace records no times); choose "
                        "mode poisson, gamma, constant or closed"]
    bad = {"trace": "nope.csv", "format": "azur", "params": {"block_size": 64}}
    problems = template_problems(_template(bad, {"mode": "poisson", "rate": 2.0})).problems
    assert problems == [
        "workload.format ('azur') must be one of sharegpt, burstgpt, azure, mooncake (did you "
        "mean 'azure'?) (the trace file's format)",
        "workload.trace ('nope.csv') is not a file"]
    wrong = {"trace": str(SAMPLES_DIR / FILES["azure"]), "format": "azure",
             "params": {"block_size": 64}}
    problems = template_problems(_template(wrong, {"mode": "trace"})).problems
    assert problems == ["workload.params: trace format 'azure' has no param 'block_size' (did "
                        "you mean 'vocab_size'?); allowed: rate_scale, max_requests, start_s, "
                        "duration_s, max_model_len, vocab_size"]



def test_the_engine_prefix_cache_sees_the_shared_hash_id_blocks(tmp_path: Path) -> None:
    """Trace blocks of 32 tokens on the engine's 16-token blocks, one request at a time: a
    request finds cached exactly the full engine blocks inside the trace blocks it shares with
    an earlier one."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.replay import run, run_sync
    from workbench.harness.targets import InProcessTarget
    from workbench.testing import tiny_checkpoint

    p = _mooncake(tmp_path, [
        {"timestamp": 0, "input_length": 70, "output_length": 2, "hash_ids": [0, 1, 2]},
        {"timestamp": 10, "input_length": 80, "output_length": 2, "hash_ids": [0, 1, 5]},
        {"timestamp": 20, "input_length": 40, "output_length": 2, "hash_ids": [0, 7]},
        {"timestamp": 30, "input_length": 40, "output_length": 2, "hash_ids": []},
    ])
    wl = load_trace("mooncake", p, block_size=32, vocab_size=200)
    ckpt = tiny_checkpoint(tmp_path / "llama", arch="llama")
    target = InProcessTarget(str(ckpt), {"dtype": "float32", "max_model_len": 128,
                                         "block_size": 16, "enable_prefix_caching": True})
    try:
        res = run(target, wl, ArrivalSpec(mode="closed", concurrency=1), warmup_requests=0,
                  cache_state="cold", max_other_cpu_share=None)
    finally:
        run_sync(target.stop)
    assert [r.num_cached_tokens for r in res.records] == [0, 64, 32, 0]
