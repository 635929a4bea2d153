"""A workload as a JSONL file: `load_jsonl` reads one request per line, `save_jsonl` writes
one back with the same checksum. Re-exported by `workbench.harness.workloads`.

Fields (JSONL_FIELDS): `prompt` (str, needs a tokenizer) or `prompt_token_ids`
(authoritative when both are given), `max_tokens`, and optional `arrival_s`, `request_id`,
`group`, `follows`, `think_s`, `turn`. A follow-up (`follows` = an earlier line's
request_id) is sent `think_s` seconds after that request finished; it has no `arrival_s`.
Bad lines raise ValueError naming the line number and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from workbench.errors import is_int
from workbench.harness.workload_base import BenchRequest, Workload

JSONL_FIELDS = ("request_id", "prompt", "prompt_token_ids", "max_tokens", "arrival_s", "group",
                "follows", "think_s", "turn")


def _bad(lineno: int, field: str, why: str) -> ValueError:
    return ValueError(f"JSONL line {lineno}: {field} {why}")


def _prompt_ids(obj: dict[str, Any], lineno: int, tokenizer: Any | None) -> list[int]:
    prompt, ids = obj.get("prompt"), obj.get("prompt_token_ids")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise _bad(lineno, "prompt", f"({prompt!r}) must be a non-empty string")
    if ids is not None:
        vocab = len(tokenizer) if tokenizer is not None else None
        if (not isinstance(ids, list) or not ids
                or not all(is_int(t) and t >= 0 and (vocab is None or t < vocab) for t in ids)):
            raise _bad(lineno, "prompt_token_ids", "must be a non-empty list of token ids "
                       f"(ints >= 0{f' and < {vocab}' if vocab else ''})")
        return ids
    if prompt is None:
        raise _bad(lineno, "prompt", "or prompt_token_ids is required")
    if tokenizer is None:
        raise _bad(lineno, "prompt", "is text but no tokenizer was given; pass tokenizer= or "
                   "give prompt_token_ids")
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if not ids:
        raise _bad(lineno, "prompt", f"({prompt!r}) tokenizes to no tokens")
    return ids


def _dependency(obj: dict[str, Any], lineno: int) -> dict[str, Any]:
    """follows / think_s / turn, validated."""
    follows, think, turn = obj.get("follows"), obj.get("think_s"), obj.get("turn")
    if follows is not None and (not isinstance(follows, str) or not follows):
        raise _bad(lineno, "follows", f"({follows!r}) must be a non-empty string (the "
                   "request_id of an earlier line)")
    if think is not None:
        if isinstance(think, bool) or not isinstance(think, int | float) or not (
                0 <= think < math.inf):
            raise _bad(lineno, "think_s", f"({think!r}) must be a finite number >= 0 (seconds)")
        if follows is None:
            raise _bad(lineno, "think_s", f"({think!r}) needs follows (the request it waits "
                       "for); drop it or name the request in follows")
    if follows is not None and obj.get("arrival_s") is not None:
        raise _bad(lineno, "arrival_s", f"({obj['arrival_s']!r}) and follows ({follows!r}) "
                   "exclude each other: a follow-up is sent think_s after the request it "
                   "follows finished")
    if turn is not None and (not is_int(turn) or turn < 0):
        raise _bad(lineno, "turn", f"({turn!r}) must be an integer >= 0")
    return {"follows": follows, "think_s": 0.0 if think is None else float(think),
            "turn": turn}


def _parse_line(obj: Any, lineno: int, tokenizer: Any | None) -> dict[str, Any]:
    """One JSONL object, validated, as BenchRequest keyword arguments (request_id may be None)."""
    if not isinstance(obj, dict):
        raise _bad(lineno, "line", f"must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(JSONL_FIELDS))
    if unknown:
        raise _bad(lineno, str(unknown), f"unknown; allowed fields: {list(JSONL_FIELDS)}")
    ids = _prompt_ids(obj, lineno, tokenizer)
    mt = obj.get("max_tokens")
    if not is_int(mt) or mt < 1:
        raise _bad(lineno, "max_tokens", f"({mt!r}) must be an integer >= 1")
    arr = obj.get("arrival_s")
    if arr is not None and (isinstance(arr, bool) or not isinstance(arr, int | float)
                            or not 0 <= arr < math.inf):
        raise _bad(lineno, "arrival_s", f"({arr!r}) must be a finite number >= 0 (seconds)")
    for key in ("request_id", "group"):
        v = obj.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise _bad(lineno, key, f"({v!r}) must be a non-empty string")
    return {"request_id": obj.get("request_id"), "prompt_token_ids": ids, "max_tokens": mt,
            "prompt": obj.get("prompt"), "arrival_s": None if arr is None else float(arr),
            "group": obj.get("group"), **_dependency(obj, lineno)}


def load_jsonl(path: str | Path, tokenizer: Any | None = None, name: str | None = None
               ) -> Workload:
    """A workload from a JSONL file: one object per line with `prompt` (str, needs
    `tokenizer`) or `prompt_token_ids` (authoritative when both are given), `max_tokens`,
    and optional `arrival_s` (non-decreasing), `request_id` (unique; default
    "<name>-<index>"), `group`, `follows` (an earlier line's request_id), `think_s`
    (seconds after it, needs follows) and `turn`. Blank lines are skipped; bad lines raise
    ValueError naming the line number and field."""
    path = Path(path)
    data = path.read_bytes()
    name = name or path.stem
    reqs: list[BenchRequest] = []
    seen: set[str] = set()
    last_arrival: float | None = None
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(lineno, "line", f"is not valid JSON ({e.msg})") from None
        kw = _parse_line(obj, lineno, tokenizer)
        kw["request_id"] = kw["request_id"] or f"{name}-{len(reqs):05d}"
        if kw["request_id"] in seen:
            raise _bad(lineno, "request_id", f"({kw['request_id']!r}) is a duplicate")
        if kw["follows"] is not None and kw["follows"] not in seen:
            raise _bad(lineno, "follows", f"({kw['follows']!r}) names no earlier line's "
                       "request_id; list a request before the requests that follow it")
        seen.add(kw["request_id"])
        arr = kw["arrival_s"]
        if arr is not None:
            if last_arrival is not None and arr < last_arrival:
                raise _bad(lineno, "arrival_s", f"({arr}) is before the previous line's "
                           f"({last_arrival}); sort the file by arrival_s")
            last_arrival = arr
        reqs.append(BenchRequest(**kw))
    if not reqs:
        raise ValueError(f"JSONL file {str(path)!r} has no requests")
    params = {"source": "jsonl", "path": str(path),
              "file_sha256": hashlib.sha256(data).hexdigest()}
    return Workload(name=name, seed=0, params=params, requests=tuple(reqs))


def save_jsonl(workload: Workload, path: str | Path) -> Path:
    """Write `workload` as JSONL that `load_jsonl` reads back with the same checksum (and
    equal requests)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for r in workload.requests:
            row: dict[str, Any] = {"request_id": r.request_id,
                                   "prompt_token_ids": list(r.prompt_token_ids),
                                   "max_tokens": r.max_tokens}
            row.update({k: getattr(r, k) for k in ("prompt", "arrival_s", "group", "follows",
                                                   "turn")
                        if getattr(r, k) is not None})
            if r.follows is not None:
                row["think_s"] = float(r.think_s)
            f.write(json.dumps(row) + "\n")
    return path
