"""ShareGPT conversations (the file vLLM's benchmarks use: ShareGPT_V3_unfiltered_cleaned_split
.json on Hugging Face, dataset anon8231489123/ShareGPT_Vicuna_unfiltered): a JSON list of

    {"id": "...", "conversations": [{"from": "human", "value": "..."},
                                    {"from": "gpt", "value": "..."}, ...]}

One request per conversation, the way vLLM's ShareGPT loader (benchmarks/datasets) builds
them: conversations with fewer than two turns are dropped ("under_two_turns"), the rest
shuffled with the seed (`shuffle: false` keeps file order); the prompt is the first turn (the
human one), tokenized; max_tokens is the token count of the second (the gpt reply). Pairs with
a prompt or reply under min_len tokens are dropped ("too_short"), with a prompt over
max_prompt_len or prompt + reply over max_total_len ("too_long"). Tokens are counted without
special tokens (the engine's prompts carry none), so a count can be one below vLLM's. No
timestamps: the template's arrival process decides when each request is sent. Needs a
tokenizer; conversations are tokenized only until max_requests are kept.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.harness.traces.options import TraceOptions, TraceRow, bad_input


def _pairs(path: Path, dropped: Counter[str]) -> list[tuple[int, str, str, str]]:
    """(index, where, prompt, reply) of every conversation with two turns; all checked."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}, line {e.lineno} column {e.colno}: not valid JSON ({e.msg}); "
                        "a ShareGPT file is a JSON list of conversations") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: a ShareGPT file is a JSON list of {{\"id\", "
                        f"\"conversations\"}} objects, not a {type(data).__name__}")
    out = []
    for i, entry in enumerate(data):
        where = f"conversation {i}"
        if not isinstance(entry, dict):
            raise bad_input(path, where, "entry", entry, 'must be an object with "id" and '
                            '"conversations"')
        if "id" in entry:
            where += f" (id {entry['id']!r})"
        turns = entry.get("conversations")
        if turns is None:
            turns = []
        if not isinstance(turns, list):
            raise bad_input(path, where, "conversations", turns, 'must be a list of '
                            '{"from": "human" | "gpt", "value": text} turns')
        if len(turns) < 2:
            dropped["under_two_turns"] += 1
            continue
        texts = []
        for k, turn in enumerate(turns[:2]):
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise bad_input(path, where, f"conversations[{k}]", turn, 'must be '
                                '{"from": "human" | "gpt", "value": text}')
            texts.append(turn["value"])
        out.append((i, where, texts[0], texts[1]))
    return out


def rows(path: Path, opts: TraceOptions, tokenizer: Any | None, seed: int,
         dropped: Counter[str]) -> Iterator[TraceRow]:
    """The file checked now; its records tokenized as they are read (drops counted)."""
    if tokenizer is None:
        raise UserError(f"{path}: a ShareGPT trace is text and needs a tokenizer to count "
                        "its tokens; give the target's model (or target.tokenizer)")
    pairs = _pairs(path, dropped)
    if opts.shuffle:
        random.Random(seed).shuffle(pairs)
    return _tokenized(pairs, opts, tokenizer, dropped)


def _tokenized(pairs: list[tuple[int, str, str, str]], opts: TraceOptions, tokenizer: Any,
               dropped: Counter[str]) -> Iterator[TraceRow]:
    for index, where, prompt, reply in pairs:
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        n_out = len(tokenizer(reply, add_special_tokens=False)["input_ids"])
        if len(ids) < opts.min_len or n_out < opts.min_len:
            dropped["too_short"] += 1
        elif len(ids) > opts.max_prompt_len or len(ids) + n_out > opts.max_total_len:
            dropped["too_long"] += 1
        else:
            yield TraceRow(index=index, where=where, timestamp_s=None, input_len=len(ids),
                           output_len=n_out, prompt_token_ids=tuple(ids), prompt=prompt)
