"""Benchmark workloads: a fixed, seeded request list whose traffic shape is recorded as data.

A `Workload` is what a serving benchmark replays: requests as exact token ids (plus the text),
the parameters that made them and a sha256 `checksum`, so two runs can prove they sent the
same traffic. It comes from a named fixture (`make_workload`), a user JSONL (`load_jsonl`) or
a trace from the field (`load_trace`: ShareGPT, BurstGPT, Azure, Mooncake; `traces/`).
When requests are *sent* is `workbench.harness.arrivals`' job, not this module's.

Fixture text is synthetic English-ish prose drawn from a fixed word list with
`random.Random(seed)`, tokenized and made exactly the sampled number of tokens long (whole
words, topped up with one-token words; if the tokenizer does not split at spaces, the ids are
cut instead); `prompt` is the decode of the ids. Draw order, so tests can replay it: all
input (or suffix) lengths, then all output lengths, from `random.Random(seed)`, then text.

Defaults (all overridable as params; lengths as `LengthDist` dicts or ints) are sized for the
bundled tiny CPU model (seconds per run). Every fixture in this module takes `num_requests` (32),
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

Session-shaped traffic, the kind a tiered KV cache serves, lives in `sessions.py`:
`multi_turn_chat` (users in sessions of T turns, each prompt the whole history plus a new
message, turn t+1 sent think_s after turn t finished) and `long_doc_qa` (a few long
documents, many questions each). Both are registered here. `BenchRequest`, `Workload`
(`workload_base.py`) and the JSONL reader and writer (`workload_jsonl.py`) are re-exported.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from workbench.harness import sessions
from workbench.harness.lengths import LengthDist
from workbench.harness.traces import load_trace as load_trace
from workbench.harness.workload_base import WORDS as WORDS
from workbench.harness.workload_base import BenchRequest as BenchRequest
from workbench.harness.workload_base import Workload as Workload
from workbench.harness.workload_base import _int_param, _Text, _upper, merged_params
from workbench.harness.workload_jsonl import JSONL_FIELDS as JSONL_FIELDS
from workbench.harness.workload_jsonl import load_jsonl as load_jsonl
from workbench.harness.workload_jsonl import save_jsonl as save_jsonl

REPEAT_HEADER = "Repeat the following text exactly:"
COMMON_DEFAULTS: dict[str, Any] = {"num_requests": 32, "max_model_len": 1024}


def _resolve(name: str, defaults: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    p = merged_params(name, {**COMMON_DEFAULTS, **defaults}, params)
    _int_param(p, "num_requests", 1)
    _int_param(p, "max_model_len", 2)
    _int_param(p, "max_input_len", 1)
    if p["max_input_len"] >= p["max_model_len"]:
        raise ValueError(f"max_input_len ({p['max_input_len']}) must be < max_model_len "
                         f"({p['max_model_len']}) to leave room for output tokens")
    return p


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
    room = p["max_model_len"] - fixed_input - _upper(d_in)
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
        room = p["max_model_len"] - _upper(d_in)
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
    "multi_turn_chat": sessions.multi_turn_chat,
    "long_doc_qa": sessions.long_doc_qa,
}


def fixture_params(name: str) -> tuple[str, ...]:
    """The parameter names fixture `name` accepts, sorted (what template validation checks
    `workload.params` against)."""
    if name in sessions.DEFAULTS:
        return tuple(sorted(sessions.DEFAULTS[name]))
    extra = IO_DEFAULTS.get(name) or {"shared-prefix": SHARED_PREFIX_DEFAULTS,
                                      "repetitive": REPETITIVE_DEFAULTS}.get(name)
    if extra is None:
        raise ValueError(f"workload name ({name!r}) must be one of {sorted(FIXTURES)}")
    return tuple(sorted({**COMMON_DEFAULTS, **extra}))


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
