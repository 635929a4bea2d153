"""Incremental detokenization and server-side stop strings, token by token."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.entrypoints.openai.protocol.detokenizer import (
    IncrementalDetokenizer,
    StopStringChecker,
)
from workbench.models.tokenizer import load_tokenizer

TEXTS = ["héllo wörld ✓ 😀 ünïcödé ok", "plain ascii, with  spaces\nand lines", "日本語のテキスト"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode(model_dir: Path, text: str) -> None:
    tok = load_tokenizer(model_dir)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)  # split UTF-8 is held back, never emitted


def test_special_tokens_are_skipped(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    ids = list(tok("abc")["input_ids"]) + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    text = "".join(detok.add([t]) for t in ids) + detok.flush()
    assert text == tok.decode(ids, skip_special_tokens=True)


def _feed(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    checker = StopStringChecker(stops)
    out = ""
    for i, piece in enumerate(pieces):
        text, hit = checker.feed(piece, final=i == len(pieces) - 1)
        out += text
        if hit is not None:
            return out, hit
    return out, None


def test_stop_string_across_deltas_is_cut_before_it() -> None:
    assert _feed(["STOP"], ["abc S", "TO", "P more"]) == ("abc ", "STOP")
    assert _feed(["xy", "b"], ["aab", "xy"]) == ("aa", "b")  # earliest occurrence wins
    assert _feed(["zz"], ["a", "b", "c"]) == ("abc", None)  # held-back tail released at the end
    assert _feed([], ["a", "b"]) == ("ab", None)


def test_stop_checker_holds_back_only_a_possible_prefix() -> None:
    checker = StopStringChecker(["END"])
    assert checker.feed("hello") == ("hel", None)  # "lo" could start "END"
    assert checker.feed(" world") == ("lo wor", None)
    assert checker.feed("", final=True) == ("ld", None)
