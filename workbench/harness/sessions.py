"""Session-shaped fixtures: multi-turn chat and long-document QA, the traffic a tiered KV
cache (offload to host memory, a store shared by replicas) is built for.

Place in the flow: `workloads.make_workload("multi_turn_chat" | "long_doc_qa", seed,
tokenizer, **params)` calls these; the runner replays the result. Like every fixture, the
request list is exact token ids with a sha256 checksum: the same (seed, params, tokenizer)
gives the same checksum, any changed param another.

multi_turn_chat (LMCache's multi-round QA benchmark, Mooncake's conversation traces): N users,
one session of T turns each. Turn t's prompt is the whole history plus a new message:

    turn 0   system + first message
    turn t   system + first message + answer_0 + message_1 + ... + answer_{t-1} + message_t

so turn t's prompt token ids are exactly a prefix of turn t+1's (every segment is space-led
words, which this project's tokenizers encode additively: the prompt text re-encodes to the
same ids). The system prompt is shared by all users. Turn t+1 `follows` turn t and carries
`think_s`: the runner sends it think_s seconds after turn t finished (closed loop per user,
as LMCache's bench and Mooncake's traces do), after a failed turn too. The first turn of each
session carries `arrival_s`, the session start (honoured by `ArrivalSpec("trace")`; closed
and open loops let the arrival process start the sessions instead).

The answers in the history are fixed, seeded synthetic text of the turn's `max_tokens`, not
what the model generated (LMCache's bench appends the real answer). Chosen for replayability:
the whole request list, and so its checksum, exists before the run; every configuration
(quantized or not, speculative or not, another engine over HTTP) gets exactly the same prompts,
so a comparison changes one variable, not the traffic; and each turn's prompt is an exact
token prefix of the next, so block-hash prefix hits are exact. The cost: the KV of the tokens
a turn generated is not reused by the next turn (its history holds the synthetic answer
instead), so each turn reuses its own previous prompt, not that prompt plus the answer.

long_doc_qa (vLLM's long-document QA throughput benchmark, LMCache's long_doc_qa): a few long
documents, many questions each; prompt = document + question, group = the document. Order:
"grouped" (a document's questions back to back: vLLM's repeat_mode "interleave"),
"interleaved" (round robin over documents: vLLM's "tile", the order that evicts a small
cache) or "random" (a seeded shuffle, vLLM's default).

Draw order from `random.Random(seed)`, so tests can replay it. multi_turn_chat: the system
prompt text; the session starts (num_users uniform draws in [0, session_start_spread_s] when
it is > 0, sorted, shifted so the first is 0); then per user: first-message length, the T-1
message lengths, the T answer lengths, the T-1 think times, then the text (first message,
then answer_t and message_{t+1} for each t < T-1). long_doc_qa: all question lengths, all
answer lengths (document-major), the documents' text, the questions' text, then the shuffle.
"""

from __future__ import annotations

import math
import random
from typing import Any

from workbench.harness.lengths import LengthDist
from workbench.harness.workload_base import (
    BenchRequest,
    Workload,
    _int_param,
    _Text,
    _upper,
    merged_params,
)

THINK_TIME_DISTS = ("exponential", "uniform", "fixed")
DOC_ORDERS = ("random", "grouped", "interleaved")

MULTI_TURN_DEFAULTS: dict[str, Any] = {
    "num_users": 4, "num_turns": 4, "system_prompt_len": 32,
    "first_message_len": {"kind": "uniform", "low": 32, "high": 64},
    "message_len": {"kind": "uniform", "low": 8, "high": 32},
    "answer_len": {"kind": "uniform", "low": 8, "high": 32},
    "think_time_s": 0.5, "think_time_dist": "exponential", "session_start_spread_s": 0.0,
    "max_model_len": 1024,
}
LONG_DOC_DEFAULTS: dict[str, Any] = {
    "num_documents": 4, "document_len": 512, "questions_per_document": 4,
    "question_len": {"kind": "uniform", "low": 8, "high": 32},
    "answer_len": {"kind": "uniform", "low": 8, "high": 32},
    "order": "random", "max_model_len": 1024,
}
DEFAULTS: dict[str, dict[str, Any]] = {"multi_turn_chat": MULTI_TURN_DEFAULTS,
                                       "long_doc_qa": LONG_DOC_DEFAULTS}


def _params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    p = merged_params(name, DEFAULTS[name], params)
    _int_param(p, "max_model_len", 2)
    return p


def _seconds(p: dict[str, Any], name: str) -> float:
    v = p[name]
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
        raise ValueError(f"{name} ({v!r}) must be a finite number of seconds >= 0")
    return float(v)


def _choice(p: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    if p[name] not in allowed:
        raise ValueError(f"{name} ({p[name]!r}) must be one of {list(allowed)}")
    return str(p[name])


def _bounded(p: dict[str, Any], name: str) -> tuple[LengthDist, int]:
    """`p[name]` as a LengthDist (recorded back as a dict) and the longest length it gives."""
    try:
        d = LengthDist.from_dict(p[name])
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    top = _upper(d)
    if top is None:
        raise ValueError(f"{name} ({d.to_dict()}) is unbounded; give it a max so the longest "
                         "prompt plus its answer can be checked against max_model_len")
    p[name] = d.to_dict()
    return d, top


def _think(rng: random.Random, dist: str, mean_s: float) -> float:
    if mean_s == 0 or dist == "fixed":
        return mean_s
    if dist == "exponential":
        return rng.expovariate(1.0 / mean_s)
    return rng.uniform(0.0, 2.0 * mean_s)  # uniform with mean mean_s


def multi_turn_chat(seed: int, tokenizer: Any, **params: Any) -> Workload:
    """num_users sessions of num_turns turns; see the module docstring."""
    name = "multi_turn_chat"
    p = _params(name, params)
    users, turns = _int_param(p, "num_users", 1), _int_param(p, "num_turns", 1)
    sys_len = _int_param(p, "system_prompt_len", 0)
    d_first, first_top = _bounded(p, "first_message_len")
    d_msg, msg_top = _bounded(p, "message_len")
    d_ans, ans_top = _bounded(p, "answer_len")
    mean_think, spread = _seconds(p, "think_time_s"), _seconds(p, "session_start_spread_s")
    dist = _choice(p, "think_time_dist", THINK_TIME_DISTS)
    longest = sys_len + first_top + (turns - 1) * (ans_top + msg_top) + ans_top
    if longest > p["max_model_len"]:
        raise ValueError(
            f"the longest session needs {longest} tokens (system_prompt_len {sys_len} + "
            f"first_message_len up to {first_top} + {turns - 1} x (answer_len up to {ans_top} "
            f"+ message_len up to {msg_top}) + the last answer up to {ans_top}), more than "
            f"max_model_len ({p['max_model_len']}); lower num_turns or the lengths, or raise "
            "max_model_len")
    rng, text = random.Random(seed), _Text(tokenizer)
    system = text.ids(rng, sys_len) if sys_len else []
    starts = [0.0] * users
    if spread > 0:
        draws = sorted(rng.uniform(0.0, spread) for _ in range(users))
        starts = [x - draws[0] for x in draws]
    reqs: list[BenchRequest] = []
    for u in range(users):
        first_len = d_first.sample(rng, 1)[0]
        msg_lens, ans_lens = d_msg.sample(rng, turns - 1), d_ans.sample(rng, turns)
        thinks = [_think(rng, dist, mean_think) for _ in range(turns - 1)]
        ids = system + text.ids(rng, first_len)
        prev: str | None = None
        for t in range(turns):
            if t:
                ids = ids + text.ids(rng, ans_lens[t - 1]) + text.ids(rng, msg_lens[t - 1])
            rid = f"{name}-u{u:04d}-t{t:03d}"
            reqs.append(BenchRequest(
                request_id=rid, prompt_token_ids=ids, max_tokens=ans_lens[t],
                prompt=tokenizer.decode(ids), arrival_s=None if t else starts[u],
                group=f"session-{u}", follows=prev, think_s=thinks[t - 1] if t else 0.0,
                turn=t))
            prev = rid
    return Workload(name, seed, p, tuple(reqs))


def long_doc_qa(seed: int, tokenizer: Any, **params: Any) -> Workload:
    """num_documents documents of document_len tokens, questions_per_document questions each;
    see the module docstring."""
    name = "long_doc_qa"
    p = _params(name, params)
    docs, doc_len = _int_param(p, "num_documents", 1), _int_param(p, "document_len", 1)
    per_doc = _int_param(p, "questions_per_document", 1)
    d_q, q_top = _bounded(p, "question_len")
    d_ans, ans_top = _bounded(p, "answer_len")
    order = _choice(p, "order", DOC_ORDERS)
    if doc_len + q_top + ans_top > p["max_model_len"]:
        raise ValueError(
            f"document_len ({doc_len}) + question_len up to {q_top} + answer_len up to "
            f"{ans_top} is more than max_model_len ({p['max_model_len']}); shorten them or "
            "raise max_model_len")
    rng, text, n = random.Random(seed), _Text(tokenizer), docs * per_doc
    q_lens, ans_lens = d_q.sample(rng, n), d_ans.sample(rng, n)
    documents = [text.ids(rng, doc_len) for _ in range(docs)]
    questions = [text.ids(rng, q_lens[i]) for i in range(n)]
    pairs = [(d, q) for d in range(docs) for q in range(per_doc)]  # grouped, document-major
    if order == "interleaved":
        pairs = [(d, q) for q in range(per_doc) for d in range(docs)]
    elif order == "random":
        rng.shuffle(pairs)
    reqs = []
    for d, q in pairs:
        i = d * per_doc + q
        ids = documents[d] + questions[i]
        reqs.append(BenchRequest(
            request_id=f"{name}-d{d:03d}-q{q:03d}", prompt_token_ids=ids,
            max_tokens=ans_lens[i], prompt=tokenizer.decode(ids), group=f"document-{d}"))
    return Workload(name, seed, p, tuple(reqs))
