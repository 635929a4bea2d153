"""scripts/kvpress_compare.py's pure parts (budget mapping, cases, tables) and the peer's
one-line refusals; kvpress itself is not needed (docs/kv_compression_peer.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvpress_compare",
                                                  ROOT / "scripts" / "kvpress_compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpress_compare"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


kc = _load()


P = kc.MethodParams(sink_tokens=4, window_size=32, kernel_size=5, beta=20)


@pytest.mark.parametrize(("n", "budget", "kept"), [
    (1000, 500, 504),    # 32 blocks: sink + 30 full + the partial last block's 8 tokens
    (1024, 256, 240),    # 16 blocks, the 16th the fresh block of the first new token
    (1024, 1024, 1008),  # budget = prompt: the first new token's block evicts one
    (96, 90, 80),        # 6 blocks: 5 full + the first new token's
    (100, 99, 100),      # 7 blocks hold all 100 tokens and the first new one
    (200, 1, 24),        # streaming_llm: the sink block + a window of one block (8 tokens)
])
def test_kept_streaming_llm_counts_the_first_new_tokens_block(
        n: int, budget: int, kept: int) -> None:
    assert kc.our_kept_tokens("streaming_llm", n, budget, P) == kept


@pytest.mark.parametrize(("n", "budget", "kept"), [
    (1000, 500, 504), (1024, 256, 240), (517, 64, 53), (200, 1, 8),
    (128, 16, 1),  # one block, the new token's: no prompt token (kvpress keeps >= 1)
])
def test_kept_h2o(n: int, budget: int, kept: int) -> None:
    assert kc.our_kept_tokens("h2o", n, budget, P) == kept


@pytest.mark.parametrize(("n", "budget", "kept"), [
    (1000, 500, 504),    # 32 prompt blocks, the last holding 8 tokens
    (1024, 256, 256),    # 16 prompt blocks (the new token's block not counted)
    (1024, 1024, 1024),  # nothing evicted
    (517, 64, 53),
    (128, 16, 32),       # a budget under the window keeps the window's 2 blocks
])
def test_kept_snapkv_counts_prompt_blocks(n: int, budget: int, kept: int) -> None:
    assert kc.our_kept_tokens("snapkv", n, budget, P) == kept


def test_kept_pyramidkv_is_the_mean_of_block_rounded_layer_budgets() -> None:
    # layer budgets 469 384 299 213 128 43 -> 30 24 19 14 8 3 blocks
    assert kc.our_kept_tokens("pyramidkv", 1024, 256, P, num_layers=6) == pytest.approx(
        (480 + 384 + 304 + 224 + 128 + 48) / 6)
    assert kc.our_kept_tokens("pyramidkv", 1024, 256, P, num_layers=1) == 256
    with pytest.raises(ValueError, match="method"):
        kc.our_kept_tokens("kivi", 1024, 256, P)


def test_kvpress_ratio_keeps_exactly_our_count() -> None:
    assert kc.kvpress_compression_ratio(1000, 504) == 0.496
    assert kc.kvpress_compression_ratio(1000, 1000) == 0.0
    assert kc.kvpress_compression_ratio(1024, 261.5) == (1024 - 261.5) / 1024  # a layer mean
    for n in (1, 7, 100, 517, 999, 1000, 1023, 2048):
        for kept in range(1, n + 1):
            ratio = kc.kvpress_compression_ratio(n, kept)
            assert 0 <= ratio < 1
            assert int(n * (1 - ratio)) == kept, (n, kept, ratio)
    with pytest.raises(ValueError, match=r"kept \(0\) must be in \[1, 10\]"):
        kc.kvpress_compression_ratio(10, 0)


def test_budget_ratio_uses_the_engines_rounding() -> None:
    from workbench.config.kv_compression import KVCompressionConfig

    for r in (0.5, 0.25, 0.125, 0.1):
        for n in (7, 100, 517, 1000):
            cfg = KVCompressionConfig(method="streaming_llm", budget_ratio=r)
            assert kc.Budget(ratio=r).tokens_for(n) == cfg.budget_for(n)
    assert kc.Budget(tokens=64).tokens_for(1000) == 64
    assert kc.Budget(ratio=0.25).label == "ratio 0.25"
    assert kc.Budget(tokens=64).label == "64 tok"
    with pytest.raises(ValueError, match="exactly one"):
        kc.Budget()


def test_our_configs_pass_the_knobs_validation() -> None:
    from workbench.config.kv_compression import KVCompressionConfig

    p = kc.MethodParams()
    for method in kc.METHODS:
        for budget in (kc.Budget(ratio=0.25), kc.Budget(tokens=128)):
            cfg = KVCompressionConfig.from_value(kc.our_config(method, budget, p))
            assert cfg is not None and cfg.method == method
    assert kc.our_config("snapkv", kc.Budget(ratio=0.5), p) == {
        "method": "snapkv", "budget_ratio": 0.5, "window_size": 32, "kernel_size": 5,
        "pooling": "avg"}


def test_press_kwargs_match_our_knobs() -> None:
    p = P
    assert kc.press_kwargs("streaming_llm", 0.5, p) == {"compression_ratio": 0.5, "n_sink": 16}
    assert kc.press_kwargs("h2o", 0.5, p) == {"compression_ratio": 0.5}
    assert kc.press_kwargs("pyramidkv", 0.5, p) == {
        "compression_ratio": 0.5, "window_size": 32, "kernel_size": 5, "beta": 20}
    with pytest.raises(ValueError, match="method"):
        kc.press_kwargs("kivi", 0.5, p)


def _case(cid: str, length: int, depth: float, question: str | None = None) -> dict:
    row = {"case_id": cid, "context_tokens": length, "depth": depth,
           "prompt": f"hay {cid} The code is 4711. hay. What is the code?", "answer": "4711",
           "max_tokens": 8}
    if question is not None:
        row["question"] = question
    return row


def test_read_cases(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(_case("a", 256, 0.5)) + "\n\n"
                    + json.dumps(_case("b", 512, 1, " What is the code?")) + "\n")
    a, b = kc.read_cases(path)
    assert (a.case_id, a.context_tokens, a.depth, a.answer, a.max_tokens, a.question) == (
        "a", 256, 0.5, "4711", 8, None)
    assert b.depth == 1.0 and isinstance(b.depth, float) and b.question == " What is the code?"
    bad = _case("c", 256, 0.5)
    bad["max_tokens"] = "8"
    path.write_text(json.dumps(_case("a", 256, 0.5)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"cases.jsonl:2: field 'max_tokens' \('8'\) must be"):
        kc.read_cases(path)


def test_kvpress_jobs_carry_the_mapped_ratio() -> None:
    case = kc.NeedleCase("a", 100, 0.5, "p", "4711", 8)
    cells = kc.grid(["streaming_llm"], [kc.Budget(ratio=0.5)])
    assert cells == [("none", None), ("streaming_llm", kc.Budget(ratio=0.5))]
    ids = [list(range(100))]
    full, sl = kc.kvpress_jobs([case], ids, cells, kc.MethodParams(), [1])
    assert full["job_id"] == "none|full|a" and full["press"] is None
    assert sl["job_id"] == "streaming_llm|ratio 0.5|a"
    assert sl["press"] == "StreamingLLMPress"
    assert sl["press_kwargs"] == {"compression_ratio": 0.48, "n_sink": 16}  # keeps 52 of 100
    assert (sl["question_start"], sl["max_tokens"], sl["eos_token_ids"]) == (None, 8, [1])
    assert kc.expected_kept(full) == 100 and kc.expected_kept(sl) == pytest.approx(52)
    # our engine stops once prompt + output reach max_model_len; kvpress's jobs too
    capped = kc.kvpress_jobs([case], ids, cells, kc.MethodParams(), [1], max_model_len=103)
    assert [j["max_tokens"] for j in capped] == [3, 3]
    at_limit = kc.kvpress_jobs([case], ids, cells, kc.MethodParams(), [1], max_model_len=100)
    assert [j["max_tokens"] for j in at_limit] == [1, 1]
    # kvpress's own split: the question (last 10 tokens) stays whole, the context keeps
    # what leaves the same total (52 - 10 = 42 of 90)
    (_, q) = kc.kvpress_jobs([case], ids, cells, kc.MethodParams(), [1], starts=[90])
    assert q["question_start"] == 90
    assert int(90 * (1 - q["press_kwargs"]["compression_ratio"])) == 42


def test_question_start_needs_a_token_boundary() -> None:
    def tokenize(text: str) -> list[int]:
        return [ord(ch) for ch in text]

    case = kc.NeedleCase("a", 10, 0.5, "hay hay?", "x", 4, question=" hay?")
    assert kc.question_start(case, tokenize(case.prompt), tokenize) == 3
    plain = kc.NeedleCase("c", 10, 0.5, "hay hay?", "x", 4)
    assert kc.question_start(plain, tokenize(plain.prompt), tokenize, "hay?") == 4
    with pytest.raises(ValueError, match="needs a 'question' field"):
        kc.question_start(kc.NeedleCase("b", 10, 0.5, "hay", "x", 4), [1], tokenize)


def _outcomes() -> list:
    a = kc.NeedleCase("a", 256, 0.0, "p", "4711", 8)
    b = kc.NeedleCase("b", 256, 1.0, "p", "4711", 8)
    c = kc.NeedleCase("c", 512, 0.0, "p", "4711", 8)
    o = kc.Outcome
    return [
        o("kvpress", "none", "full", a, (1, 2), True), o("ours", "none", "full", a, (1, 2), True),
        o("kvpress", "none", "full", b, (3,), True), o("ours", "none", "full", b, (3,), True),
        o("kvpress", "none", "full", c, (4,), True), o("ours", "none", "full", c, (4,), True),
        o("kvpress", "snapkv", "ratio 0.25", a, (1, 2), True),
        o("ours", "snapkv", "ratio 0.25", a, (1, 2), True),
        o("kvpress", "snapkv", "ratio 0.25", b, (5,), True),
        o("ours", "snapkv", "ratio 0.25", b, (6,), False),
        o("kvpress", "snapkv", "ratio 0.25", c, (7,), False),
        o("ours", "snapkv", "ratio 0.25", c, (7,), False),
    ]


def test_accuracy_rows_and_tables() -> None:
    outcomes = _outcomes()
    rows = kc.accuracy_rows(outcomes)
    assert rows[:3] == [
        {"side": "kvpress", "method": "none", "budget": "full", "context_tokens": 256,
         "depth": 0.0, "n": 1, "correct": 1},
        {"side": "kvpress", "method": "none", "budget": "full", "context_tokens": 256,
         "depth": 1.0, "n": 1, "correct": 1},
        {"side": "kvpress", "method": "none", "budget": "full", "context_tokens": 512,
         "depth": 0.0, "n": 1, "correct": 1},
    ]
    assert len(rows) == 12
    cells = kc.grid(["snapkv"], [kc.Budget(ratio=0.25)])
    assert kc.comparison_table(outcomes, cells).splitlines() == [
        "| method | kvpress press | budget | cases | kvpress acc % | ours acc % | "
        "ours - kvpress (pts) | same tokens % |",
        "|---|---|---|---:|---:|---:|---:|---:|",
        "| none | (none) | full | 3 | 100.0 | 100.0 | +0.0 | 100.0 |",
        "| snapkv | SnapKVPress | ratio 0.25 | 3 | 66.7 | 33.3 | -33.3 | 66.7 |",
    ]
    assert kc.length_table(rows).splitlines() == [
        "| method | budget | side | 256 tok | 512 tok |",
        "|---|---|---|---:|---:|",
        "| none | full | kvpress | 100.0 | 100.0 |",
        "| none | full | ours | 100.0 | 100.0 |",
        "| snapkv | ratio 0.25 | kvpress | 100.0 | 0.0 |",
        "| snapkv | ratio 0.25 | ours | 50.0 | 0.0 |",
    ]


def test_mapping_table() -> None:
    table = kc.mapping_table([1024, 100, 1024], [kc.Budget(ratio=0.25), kc.Budget(tokens=64)],
                             ["streaming_llm", "snapkv", "pyramidkv"], P, num_layers=6)
    assert table.splitlines()[2:] == [
        "| 100 | ratio 0.25 | 25 | 2 | streaming_llm | 20 | 0.8000 |",
        "| 100 | ratio 0.25 | 25 | 2 | snapkv | 36 | 0.6400 |",
        "| 100 | ratio 0.25 | 25 | 2 | pyramidkv | 36 | 0.6400 |",
        "| 100 | 64 tok | 64 | 4 | streaming_llm | 52 | 0.4800 |",
        "| 100 | 64 tok | 64 | 4 | snapkv | 52 | 0.4800 |",
        "| 100 | 64 tok | 64 | 4 | pyramidkv | 60 | 0.4000 |",
        "| 1024 | ratio 0.25 | 256 | 16 | streaming_llm | 240 | 0.7656 |",
        "| 1024 | ratio 0.25 | 256 | 16 | snapkv | 256 | 0.7500 |",
        "| 1024 | ratio 0.25 | 256 | 16 | pyramidkv | 261.333 | 0.7448 |",
        "| 1024 | 64 tok | 64 | 4 | streaming_llm | 48 | 0.9531 |",
        "| 1024 | 64 tok | 64 | 4 | snapkv | 64 | 0.9375 |",
        "| 1024 | 64 tok | 64 | 4 | pyramidkv | 72 | 0.9297 |",
    ]


def test_is_correct_and_strip_eos() -> None:
    assert kc.is_correct("48213", " 48213\n")  # the quality gate's rule: the first digits
    assert not kc.is_correct("48213", " 482130")
    assert not kc.is_correct("48213", "PASSKEY = 48213")
    assert kc.strip_eos([5, 1, 1], [1]) == (5,)


def test_compare_refuses_in_one_line_without_the_peer(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    rc = kc.main(["--cases", str(tmp_path / "none.jsonl"),
                  "--kvpress-python", str(tmp_path / "missing" / "bin" / "python"),
                  "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "make peer-kvpress" in err


def test_peer_script_check_refuses_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CHECK": "1", "KVPRESS_VENV": str(tmp_path / "kvpress")}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "peer_kvpress.sh")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == (f"peer-kvpress: {tmp_path / 'kvpress'} is missing; build it with "
                          "`make peer-kvpress`\n")
