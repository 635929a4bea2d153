"""The needle task's cases and scorer (workbench.testing.needle_cases, experiments.needle):
exact token counts, exact depth placement, seeded passkeys, prompts that re-tokenize to their
own ids, the exact-match scorer, the JSONL export a peer reads. Torch-free apart from the
package import; the demo tokenizer (the needle model ships the same bytes)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from workbench.experiments import needle as nd
from workbench.experiments.quality_report import MIN_NEEDLE_TOKENS
from workbench.testing import needle_cases as nc

LENGTHS = (64, 128, 1024)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return nd.load_tokenizer("demo")


@pytest.fixture(scope="module")
def hay(tok: Tokenizer) -> nc.Haystack:
    return nc.Haystack.from_stdlib(tok, "held_out")


@pytest.fixture(scope="module")
def grid(hay: nc.Haystack) -> list[nc.NeedleCase]:
    return nc.make_grid(hay, LENGTHS, nc.DEFAULT_DEPTHS, cases_per_cell=2, seed=0)


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def test_every_case_has_exactly_its_length_and_retokenizes(
        tok: Tokenizer, grid: list[nc.NeedleCase]) -> None:
    assert len(grid) == 3 * 5 * 2
    assert [c.case_id for c in grid[:3]] == ["len64-depth0-0", "len64-depth0-1",
                                             "len64-depth0.25-0"]
    for c in grid:
        assert len(c.prompt_token_ids) == c.context_tokens
        assert list(tok.encode(c.prompt).ids) == list(c.prompt_token_ids)  # "<s>" included
        assert c.prompt_token_ids[0] == 0 and c.prompt.endswith(nc.QUESTION)
        assert c.max_tokens == len(_ids(tok, " " + c.answer)) + nc.EXTRA_ANSWER_TOKENS


def test_the_needle_sits_at_its_depth(tok: Tokenizer, grid: list[nc.NeedleCase]) -> None:
    question = _ids(tok, nc.QUESTION)
    for c in grid:
        needle = _ids(tok, nc.NEEDLE_LINE.format(passkey=c.answer))
        i, ids = c.needle_token_index, list(c.prompt_token_ids)
        assert ids[i:i + len(needle)] == needle
        assert ids[len(ids) - len(question):] == question
        h = c.context_tokens - 1 - len(needle) - len(question)  # haystack tokens
        before = i - 1
        assert before == nc._split(h, c.depth) and abs(before - c.depth * h) <= 1
        assert c.prompt.count(nc.NEEDLE_KEY + " =") == 2  # the needle and the question
        if c.depth == 0.0:
            assert i == 1 and c.prompt.startswith(f"PASSKEY = {c.answer}\n")
        if c.depth == 1.0:
            assert i + len(needle) == len(ids) - len(question)
            assert c.prompt.endswith(f"PASSKEY = {c.answer}\n{nc.QUESTION}")


def test_split_keeps_pieces_off_one_token() -> None:
    assert [nc._split(10, d) for d in (0.0, 0.05, 0.1, 0.5, 0.9, 0.95, 1.0)] == \
        [0, 0, 2, 5, 8, 10, 10]


def test_passkeys_are_seeded(hay: nc.Haystack, grid: list[nc.NeedleCase]) -> None:
    again = nc.make_grid(hay, LENGTHS, nc.DEFAULT_DEPTHS, cases_per_cell=2, seed=0)
    assert again == grid
    other = nc.make_grid(hay, LENGTHS, nc.DEFAULT_DEPTHS, cases_per_cell=2, seed=1)
    assert [c.answer for c in other] != [c.answer for c in grid]
    assert all(len(c.answer) == nc.PASSKEY_DIGITS and c.answer.isdigit() for c in grid)
    assert len({c.answer for c in grid}) == len(grid)
    # the seed is a string: the same on every Python (random's version 2 seeding)
    assert random.Random("0/128/0.0/0").randrange(10_000, 100_000) == int(
        nc.make_case(hay, 128, 0.0, nc.case_rng(0, 128, 0.0, 0)).answer)


def test_fill_gives_exact_token_counts(hay: nc.Haystack) -> None:
    rng = random.Random(7)
    for n in [0, *range(2, 80), 333, 1000]:
        ids = hay.fill(n, rng)
        assert len(ids) == n
        text = hay.tokenizer.decode(ids)
        assert list(hay.tokenizer.encode(text, add_special_tokens=False).ids) == ids
    with pytest.raises(ValueError, match="0 or >= 2 tokens, not 1"):
        hay.fill(1, rng)


def test_chunks_start_in_column_zero() -> None:
    text = "import os\n\n\ndef f(x):  \n    return x\n\n# c\nPASSKEY = 1\n  \n"
    assert nc.code_chunks(text) == ["import os\n", "def f(x):\n    return x\n", "# c\n"]


@pytest.mark.parametrize(("text", "ok"), [
    (" 48213\n", True), ("48213", True), ("\n 48213 is it", True), (" 482130", False),
    (" 4821", False), ("x 48213", False), ("", False), (" 48213.5", True),
])
def test_scorer_is_exact_match(text: str, ok: bool) -> None:
    assert nc.passkey_correct(text, "48213") is ok


def test_score_outputs_counts_engine_errors_as_wrong(grid: list[nc.NeedleCase]) -> None:
    cases = grid[:3]
    res = nd.score_outputs(cases, [f" {cases[0].answer}\n", " 1", f" {cases[2].answer}"],
                           [None, None, "boom"])
    assert [r.correct for r in res] == [True, False, False]
    assert [r.predicted for r in res] == [cases[0].answer, "1", cases[2].answer]
    rep = nd.NeedleReport("m", {}, [64], [0.0, 0.25], 2, 0, res)
    assert rep.correct == 1 and rep.accuracy == 1 / 3
    assert rep.cells() == {(64, 0.0): 0.5, (64, 0.25): 0.0}
    assert rep.worst_cells() == [(64, 0.25, 0.0), (64, 0.0, 0.5)]
    assert rep.table().splitlines() == [
        "| depth \\ length |   64 |   all |",
        "|----------------|------|-------|",
        "|              0 |  1/2 |  0.50 |",
        "|           0.25 |  0/1 |  0.00 |",
        "|            all | 0.33 | 0.333 |",
    ]


def test_export_jsonl_is_plain(tok: Tokenizer, grid: list[nc.NeedleCase], tmp_path: Path
                               ) -> None:
    path = nd.export_jsonl(grid[:4], tmp_path / "cases.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 4
    assert list(rows[0]) == ["case_id", "context_tokens", "depth", "prompt", "answer",
                             "max_tokens", "needle_token_index"]
    for row, c in zip(rows, grid, strict=False):
        assert len(tok.encode(row["prompt"]).ids) == row["context_tokens"] == c.context_tokens
        assert row["answer"] == c.answer and row["depth"] == c.depth


def test_keep_ends_cuts_the_middle(tok: Tokenizer, hay: nc.Haystack) -> None:
    mid = nc.make_case(hay, 512, 0.5, random.Random(3))
    cut = nc.keep_ends(mid, 4, 60, tok)
    assert cut.context_tokens == 64 and cut.needle_token_index == -1
    assert cut.prompt_token_ids == mid.prompt_token_ids[:4] + mid.prompt_token_ids[-60:]
    last = nc.make_case(hay, 512, 1.0, random.Random(3))
    kept = nc.keep_ends(last, 4, 60, tok)
    i = kept.needle_token_index
    assert i > 4 and kept.prompt_token_ids[i:i + 4] == last.prompt_token_ids[
        last.needle_token_index:last.needle_token_index + 4]


@pytest.mark.parametrize(("lengths", "depths", "msg"), [
    ([32], [0.5], r"needle length \(32\) must be an integer >= 64"),
    ([128], [1.5], r"needle depth \(1.5\) must be a number in \[0, 1\]"),
    ([True], [0.5], r"needle length \(True\)"),
    ([], [0.5], "at least one length"),
])
def test_bad_grids_are_refused(hay: nc.Haystack, lengths: list[int], depths: list[float],
                               msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        nc.make_grid(hay, lengths, depths)


def test_gate_minimum_matches_the_cases() -> None:
    assert MIN_NEEDLE_TOKENS == nc.MIN_CONTEXT_TOKENS


def test_the_cli_exports_without_running(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.jsonl"
    assert nd.main(["--model", "demo", "--lengths", "64", "128", "--depths", "0.5",
                    "--cases-per-cell", "2", "--export", str(out), "--export-only"]) == 0
    assert capsys.readouterr().out == f"wrote 4 cases to {out}\n"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["case_id"] for r in rows] == ["len64-depth0.5-0", "len64-depth0.5-1",
                                            "len128-depth0.5-0", "len128-depth0.5-1"]


@pytest.mark.parametrize(("args", "line"), [
    (["--lengths", "32", "--export-only", "--export", "x.jsonl"],
     "workbench needle: needle length (32) must be an integer >= 64 (prompt tokens)"),
    (["--engine", "[1]"], "workbench needle: --engine must be a JSON object of engine knobs; "
                          "got '[1]'"),
    (["--model", "/no/such"], "workbench needle: model ('/no/such') is neither a local "
                              "folder nor a shipped name (bundled, demo, demo-draft, needle)"),
    (["--export-only"], "workbench needle: --export-only needs --export CASES.jsonl"),
])
def test_cli_errors_are_one_line(args: list[str], line: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from workbench import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["needle", *args])
    assert e.value.code == 2
    assert capsys.readouterr().err == line + "\n"
