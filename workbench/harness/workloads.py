"""Benchmark workloads: a fixed, seeded request list whose traffic shape is recorded as data.

A `Workload` is what a serving benchmark replays: requests as exact token ids (plus the text),
the parameters that made them and a sha256 `checksum`, so two runs can prove they sent the
same traffic. It comes from a named fixture (`make_workload`) or a user JSONL (`load_jsonl`).
When requests are *sent* is `workbench.harness.arrivals`' job, not this module's.

Fixture text is synthetic English-ish prose drawn from a fixed word list with
`random.Random(seed)`, tokenized and made exactly the sampled number of tokens long (whole
words, topped up with one-token words; if the tokenizer does not split at spaces, the ids are
cut instead); `prompt` is the decode of the ids. Draw order, so tests can replay it: all
input (or suffix) lengths, then all output lengths, from `random.Random(seed)`, then text.

Defaults (all overridable as params; lengths as `LengthDist` dicts or ints) are sized for the
bundled tiny CPU model (seconds per run). Every fixture takes `num_requests` (32),
`max_model_len` (1024) and `max_input_len`; inputs are capped at `max_input_len` and outputs
at `max_model_len` minus the longest possible input, so every request fits. Fixed/uniform
lengths must fit under their cap; lognormal tails are clamped at it (recorded in `params`).

    fixture        input tokens                          output tokens            max_input_len
    balanced-chat  lognormal p50 64, p95 256             lognormal p50 32, p95 128   512
    long-prefill   lognormal p50 384, p95 768            uniform 8..32               896
    long-decode    uniform 16..64                        lognormal p50 256, p95 640  128
    shared-prefix  prefix_len 192 + suffix_len 16..64    uniform 16..64              512
                   (num_prefix_groups 4, request i in group i % 4)
    repetitive     uniform 64..256: "Repeat the following text exactly:<text>\\n<text>"
                   (<text> is space-led words, the same ids twice);
                   output_len None = the text's length, capped to fit max_model_len    512

Production-scale example (4x the defaults; the seed's historical ShareGPT sample averaged
232.6 prompt / 220.6 output tokens): balanced-chat with
num_requests=1000, input_len={"kind": "lognormal", "p50": 256, "p95": 1024},
output_len={"kind": "lognormal", "p50": 128, "p95": 512}, max_input_len=4096,
max_model_len=8192; shared-prefix with prefix_len=2048, suffix_len={"kind": "uniform",
"low": 64, "high": 256}, num_prefix_groups=8.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from workbench.harness.lengths import LengthDist

WORDS = tuple(
    "the of to and a in is for that return value list file data name type object default "
    "string set key line text result method class function module field group first new "
    "start end check count add format match number error time user system request model "
    "token cache block memory queue batch server client prompt output input length word "
    "order state table call test case path buffer stream event thread process page record "
    "index entry node tree graph point range share short long fast slow last next old open "
    "close read write send receive stop begin build run load save copy move find sort "
    "remove update create delete parse print split join river mountain garden window light "
    "music letter story city market winter summer morning evening travel simple quiet".split()
)
REPEAT_HEADER = "Repeat the following text exactly:"
COMMON_DEFAULTS: dict[str, Any] = {"num_requests": 32, "max_model_len": 1024}


@dataclass(frozen=True)
class BenchRequest:
    """One request: exact prompt token ids, how many tokens to generate, and optional extras."""

    request_id: str
    prompt_token_ids: list[int]  # always token ids (exact for the in-process engine)
    max_tokens: int
    prompt: str | None = None  # the text, when known (HTTP targets may prefer it)
    arrival_s: float | None = None  # only from a user JSONL; else the arrival process decides
    group: str | None = None  # e.g. the prefix group for shared-prefix


def _percentile(values: list[int], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Workload:
    """A named, seeded request list and the parameters that made it."""

    name: str
    seed: int
    params: dict[str, Any]  # the fixture parameters after defaults, JSON-serialisable
    requests: tuple[BenchRequest, ...]

    @cached_property
    def checksum(self) -> str:
        """sha256 hex of the canonical JSON of (request_id, prompt_token_ids, max_tokens,
        arrival_s), in request order."""
        rows = [{"request_id": r.request_id, "prompt_token_ids": list(r.prompt_token_ids),
                 "max_tokens": r.max_tokens, "arrival_s": r.arrival_s} for r in self.requests]
        blob = json.dumps(rows, separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        """Counts, token totals, measured p50/p95 input and output lengths, params, checksum."""
        ins = [len(r.prompt_token_ids) for r in self.requests]
        outs = [r.max_tokens for r in self.requests]
        return {
            "name": self.name, "seed": self.seed, "num_requests": len(self.requests),
            "total_input_tokens": sum(ins), "total_output_tokens": sum(outs),
            "input_len_p50": _percentile(ins, 50), "input_len_p95": _percentile(ins, 95),
            "output_len_p50": _percentile(outs, 50), "output_len_p95": _percentile(outs, 95),
            "params": self.params, "checksum": self.checksum,
        }


class _Text:
    """Synthetic text of an exact token length for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        ids = tokenizer([" " + w for w in WORDS], add_special_tokens=False)["input_ids"]
        self.cost = {w: len(i) for w, i in zip(WORDS, ids, strict=True)}
        self.singles = [w for w in WORDS if self.cost[w] == 1]

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def ids(self, rng: random.Random, n: int) -> list[int]:
        """`n` token ids of space-led words (" w1 w2 ..."), whole words when possible."""
        words, total = [], 0
        while True:
            w = rng.choice(WORDS)
            if total + self.cost[w] > n:
                break
            words.append(w)
            total += self.cost[w]
        if self.singles:
            words += [rng.choice(self.singles) for _ in range(n - total)]
        ids = self.encode("".join(" " + w for w in words))
        while len(ids) < n:  # fallback: the tokenizer is not additive over words
            words += [rng.choice(WORDS) for _ in range(n - len(ids))]
            ids = self.encode("".join(" " + w for w in words))
        return ids[:n]


def _int_param(p: dict[str, Any], name: str, low: int) -> int:
    v = p[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"{name} ({v!r}) must be an integer >= {low}")
    return v


def _resolve(name: str, defaults: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    allowed = {**COMMON_DEFAULTS, **defaults}
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"fixture {name!r} got unknown params {unknown}; allowed: {sorted(allowed)}"
        )
    p = {**allowed, **params}
    _int_param(p, "num_requests", 1)
    _int_param(p, "max_model_len", 2)
    _int_param(p, "max_input_len", 1)
    if p["max_input_len"] >= p["max_model_len"]:
        raise ValueError(f"max_input_len ({p['max_input_len']}) must be < max_model_len "
                         f"({p['max_model_len']}) to leave room for output tokens")
    return p


def _upper(d: LengthDist) -> int | None:
    """The largest length `d` can produce (None: unbounded)."""
    top = {"fixed": d.value, "uniform": d.high}.get(d.kind)
    return d.max if top is None else d.clamp(top)


def _capped(field: str, raw: Any, cap: int, cap_name: str) -> LengthDist:
    """`raw` as a LengthDist under `cap`: lognormal tails clamped, fixed/uniform must fit."""
    try:
        d = LengthDist.from_dict(raw)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None
    top = _upper(d)
    if d.min > cap or (d.kind != "lognormal" and top is not None and top > cap):
        raise ValueError(f"{field} ({d.to_dict()}) exceeds {cap_name} ({cap}); raise "
                         f"{cap_name} or shorten {field}")
    return replace(d, max=min(d.max or cap, cap)) if d.kind == "lognormal" else d


def _io_dists(p: dict[str, Any], key: str, cap: int, cap_name: str, fixed_input: int = 0
              ) -> tuple[LengthDist, LengthDist]:
    """Cap `p[key]` (input or suffix lengths) and `p["output_len"]`; record them in `p`."""
    d_in = _capped(key, p[key], cap, cap_name)
    room = p["max_model_len"] - fixed_input - _upper(d_in)  # type: ignore[operator]
    d_out = _capped("output_len", p["output_len"], room, "max_model_len - longest input")
    p[key], p["output_len"] = d_in.to_dict(), d_out.to_dict()
    return d_in, d_out


def _request(name: str, i: int, text: _Text, ids: list[int], max_tokens: int,
             group: str | None = None) -> BenchRequest:
    return BenchRequest(request_id=f"{name}-{i:05d}", prompt_token_ids=ids, max_tokens=max_tokens,
                        prompt=text.tok.decode(ids), group=group)


def _io_fixture(name: str, defaults: dict[str, Any], seed: int, tokenizer: Any,
                **params: Any) -> Workload:
    """balanced-chat, long-prefill, long-decode: independent input and output lengths."""
    p = _resolve(name, defaults, params)
    d_in, d_out = _io_dists(p, "input_len", p["max_input_len"], "max_input_len")
    rng, n, text = random.Random(seed), p["num_requests"], _Text(tokenizer)
    ins, outs = d_in.sample(rng, n), d_out.sample(rng, n)
    reqs = [_request(name, i, text, text.ids(rng, ins[i]), outs[i]) for i in range(n)]
    return Workload(name, seed, p, tuple(reqs))


def _shared_prefix(seed: int, tokenizer: Any, **params: Any) -> Workload:
    name = "shared-prefix"
    p = _resolve(name, SHARED_PREFIX_DEFAULTS, params)
    groups, plen = _int_param(p, "num_prefix_groups", 1), _int_param(p, "prefix_len", 1)
    if plen >= p["max_input_len"]:
        raise ValueError(f"prefix_len ({plen}) must be < max_input_len ({p['max_input_len']})")
    d_suf, d_out = _io_dists(p, "suffix_len", p["max_input_len"] - plen,
                            "max_input_len - prefix_len", fixed_input=plen)
    rng, n, text = random.Random(seed), p["num_requests"], _Text(tokenizer)
    sufs, outs = d_suf.sample(rng, n), d_out.sample(rng, n)
    prefixes = [text.ids(rng, plen) for _ in range(groups)]
    reqs = [_request(name, i, text, prefixes[i % groups] + text.ids(rng, sufs[i]), outs[i],
                     group=f"prefix-{i % groups}") for i in range(n)]
    return Workload(name, seed, p, tuple(reqs))


def _repetitive(seed: int, tokenizer: Any, **params: Any) -> Workload:
    name = "repetitive"
    p = _resolve(name, REPETITIVE_DEFAULTS, params)
    text = _Text(tokenizer)
    head, sep = text.encode(REPEAT_HEADER), text.encode("\n")
    need = len(head) + len(sep) + 2
    d_in = _capped("input_len", p["input_len"], p["max_input_len"], "max_input_len")
    low = {"fixed": d_in.value, "uniform": d_in.low}.get(d_in.kind) or d_in.min
    if d_in.clamp(low) < need:
        raise ValueError(f"input_len ({d_in.to_dict()}) can go below {need} tokens, the "
                         f"shortest repeat prompt for this tokenizer; raise its low/min")
    p["input_len"] = d_in.to_dict()
    rng, n = random.Random(seed), p["num_requests"]
    ins = d_in.sample(rng, n)
    d_out = None
    if p["output_len"] is not None:
        room = p["max_model_len"] - _upper(d_in)  # type: ignore[operator]
        d_out = _capped("output_len", p["output_len"], room, "max_model_len - longest input")
        p["output_len"] = d_out.to_dict()
    outs = d_out.sample(rng, n) if d_out else [0] * n
    reqs = []
    for i, length in enumerate(ins):
        m, pad = divmod(length - len(head) - len(sep), 2)
        body = text.ids(rng, m)
        ids = head + body + sep + body + sep[-1:] * pad
        out = outs[i] if d_out else min(m, p["max_model_len"] - length)
        reqs.append(_request(name, i, text, ids, out))
    return Workload(name, seed, p, tuple(reqs))


SHARED_PREFIX_DEFAULTS: dict[str, Any] = {
    "num_prefix_groups": 4, "prefix_len": 192, "max_input_len": 512,
    "suffix_len": {"kind": "uniform", "low": 16, "high": 64},
    "output_len": {"kind": "uniform", "low": 16, "high": 64},
}
REPETITIVE_DEFAULTS: dict[str, Any] = {
    "input_len": {"kind": "uniform", "low": 64, "high": 256}, "output_len": None,
    "max_input_len": 512,
}
IO_DEFAULTS: dict[str, dict[str, Any]] = {
    "balanced-chat": {"input_len": {"kind": "lognormal", "p50": 64, "p95": 256},
                      "output_len": {"kind": "lognormal", "p50": 32, "p95": 128},
                      "max_input_len": 512},
    "long-prefill": {"input_len": {"kind": "lognormal", "p50": 384, "p95": 768},
                     "output_len": {"kind": "uniform", "low": 8, "high": 32},
                     "max_input_len": 896},
    "long-decode": {"input_len": {"kind": "uniform", "low": 16, "high": 64},
                    "output_len": {"kind": "lognormal", "p50": 256, "p95": 640},
                    "max_input_len": 128},
}
FIXTURES: dict[str, Callable[..., Workload]] = {
    **{k: partial(_io_fixture, k, v) for k, v in IO_DEFAULTS.items()},
    "shared-prefix": _shared_prefix,
    "repetitive": _repetitive,
}


def make_workload(name: str, seed: int, tokenizer: Any, **params: Any) -> Workload:
    """The fixture `name` built with `seed`; same (name, seed, params, tokenizer) -> same
    checksum. `FIXTURES[name](seed, tokenizer, **params)` is the same call."""
    if name not in FIXTURES:
        raise ValueError(f"workload name ({name!r}) must be one of {sorted(FIXTURES)}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed ({seed!r}) must be an integer")
    if tokenizer is None:
        raise ValueError("tokenizer is None; fixtures need one to build exact-length prompts")
    return FIXTURES[name](seed, tokenizer, **params)


_JSONL_FIELDS = ("request_id", "prompt", "prompt_token_ids", "max_tokens", "arrival_s", "group")


def _bad(lineno: int, field: str, why: str) -> ValueError:
    return ValueError(f"JSONL line {lineno}: {field} {why}")


def _parse_line(obj: Any, lineno: int, tokenizer: Any | None) -> dict[str, Any]:
    """One JSONL object, validated, as BenchRequest keyword arguments (request_id may be None)."""
    if not isinstance(obj, dict):
        raise _bad(lineno, "line", f"must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_JSONL_FIELDS))
    if unknown:
        raise _bad(lineno, str(unknown), f"unknown; allowed fields: {list(_JSONL_FIELDS)}")
    prompt, ids = obj.get("prompt"), obj.get("prompt_token_ids")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise _bad(lineno, "prompt", f"({prompt!r}) must be a non-empty string")
    if ids is not None:
        vocab = len(tokenizer) if tokenizer is not None else None
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                           and (vocab is None or t < vocab) for t in ids)):
            raise _bad(lineno, "prompt_token_ids", "must be a non-empty list of token ids "
                       f"(ints >= 0{f' and < {vocab}' if vocab else ''})")
    elif prompt is None:
        raise _bad(lineno, "prompt", "or prompt_token_ids is required")
    elif tokenizer is None:
        raise _bad(lineno, "prompt", "is text but no tokenizer was given; pass tokenizer= or "
                   "give prompt_token_ids")
    else:
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if not ids:
            raise _bad(lineno, "prompt", f"({prompt!r}) tokenizes to no tokens")
    mt = obj.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
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
            "prompt": prompt, "arrival_s": None if arr is None else float(arr),
            "group": obj.get("group")}


def load_jsonl(path: str | Path, tokenizer: Any | None = None, name: str | None = None
               ) -> Workload:
    """A workload from a JSONL file: one object per line with `prompt` (str, needs
    `tokenizer`) or `prompt_token_ids` (authoritative when both are given), `max_tokens`,
    and optional `arrival_s` (non-decreasing), `request_id` (unique; default
    "<name>-<index>") and `group`. Blank lines are skipped; bad lines raise ValueError
    naming the line number and field."""
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
    """Write `workload` as JSONL that `load_jsonl` reads back with the same checksum."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for r in workload.requests:
            row = {"request_id": r.request_id, "prompt_token_ids": list(r.prompt_token_ids),
                   "max_tokens": r.max_tokens}
            row.update({k: getattr(r, k) for k in ("prompt", "arrival_s", "group")
                        if getattr(r, k) is not None})
            f.write(json.dumps(row) + "\n")
    return path
