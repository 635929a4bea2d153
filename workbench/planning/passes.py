"""Forward passes, the decode step's memory-bound floor, replica scaling and speculative
decoding's arithmetic (seeds 000, 002 and 003)."""

from __future__ import annotations

import math

from workbench.core.kv_cache.utils import cdiv
from workbench.planning.checks import need_int, need_num


def forward_passes(prompt_tokens: int, output_tokens: int, max_num_batched_tokens: int) -> int:
    """ceil(prompt / budget) prefill chunks + (output_tokens - 1) decode passes.

    The last prefill chunk emits the first output token, so 300 outputs after a prompt that fits
    the budget take 300 passes, not 301. One request alone (decodes of others share the budget).
    """
    need_int("prompt_tokens", prompt_tokens, 1)
    need_int("output_tokens", output_tokens, 1)
    need_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    return cdiv(prompt_tokens, max_num_batched_tokens) + output_tokens - 1


def decode_step_lower_bound_s(
    weight_bytes: float, kv_bytes: float, bandwidth_bytes_per_s: float
) -> float:
    """(weight_bytes + kv_bytes) / bandwidth: decode is memory-bound; weights are read once per
    step for the whole batch, KV once per request. Under TP use per-card bytes and bandwidth
    (or totals for both)."""
    need_num("weight_bytes", weight_bytes, 0.0)
    need_num("kv_bytes", kv_bytes, 0.0)
    need_num("bandwidth_bytes_per_s", bandwidth_bytes_per_s, 0.0)
    if bandwidth_bytes_per_s == 0:
        raise ValueError("bandwidth_bytes_per_s must be > 0, got 0")
    return (weight_bytes + kv_bytes) / bandwidth_bytes_per_s


def scaling_efficiency(throughput_n: float, throughput_1: float, n: int) -> float:
    """throughput_n / (n x throughput_1): how much of n independent replicas' ideal linear
    speed-up a deployment keeps (1.0 = linear; seeds 001 step 08 and 003). Throughputs in the
    same unit (e.g. output tok/s) measured on the same workload."""
    need_num("throughput_n", throughput_n, 0.0)
    need_num("throughput_1", throughput_1, 0.0)
    need_int("n", n, 1)
    if throughput_1 == 0:
        raise ValueError("throughput_1 must be > 0 (the single-replica baseline), got 0")
    if not math.isfinite(throughput_n) or not math.isfinite(throughput_1):
        raise ValueError(f"throughputs must be finite, got {throughput_n!r} and {throughput_1!r}")
    return throughput_n / (n * throughput_1)


def spec_acceptance_prob(p_target: float, q_draft: float) -> float:
    """min(1, p/q); on rejection resample from norm(max(0, p - q)), so the output is lossless."""
    need_num("p_target", p_target, 0.0, 1.0)
    need_num("q_draft", q_draft, 0.0, 1.0)
    if q_draft == 0:
        raise ValueError("q_draft must be > 0 (the draft sampled this token), got 0")
    return min(1.0, p_target / q_draft)


def spec_expected_tokens(acceptance_rate: float, num_spec_tokens: int) -> float:
    """Tokens per verification, i.i.d. acceptance a and k drafts: (1 - a^(k+1)) / (1 - a);
    k + 1 when a == 1. The +1 is the token the target emits at the first rejection (or after
    the last draft)."""
    need_num("acceptance_rate", acceptance_rate, 0.0, 1.0)
    need_int("num_spec_tokens", num_spec_tokens, 0)
    if acceptance_rate == 1:
        return float(num_spec_tokens + 1)
    return (1 - acceptance_rate ** (num_spec_tokens + 1)) / (1 - acceptance_rate)


def spec_forward_passes(output_tokens: int, num_drafts: int, accepted_tokens: int) -> int:
    """Decode forwards with speculation, seed 002's reconstruction (one request or totals):

        draft steps make accepted + drafts tokens; the rest, output - (accepted + drafts), take
        one plain step each; forwards = drafts + output - accepted - drafts = output - accepted.

    68 tokens, 8 drafts, 34 accepted: 8 + 26 = 34 forwards against 68 without speculation.
    """
    need_int("output_tokens", output_tokens, 1)
    need_int("num_drafts", num_drafts, 0)
    need_int("accepted_tokens", accepted_tokens, 0)
    if accepted_tokens + num_drafts > output_tokens:
        raise ValueError(
            f"accepted_tokens ({accepted_tokens}) + num_drafts ({num_drafts}) exceed "
            f"output_tokens ({output_tokens}): each draft step emits accepted + 1 tokens"
        )
    return output_tokens - accepted_tokens


def spec_predicted_speedup(output_tokens: int, num_drafts: int, accepted_tokens: int) -> float:
    """output_tokens / spec_forward_passes: one forward per token without speculation."""
    return output_tokens / spec_forward_passes(output_tokens, num_drafts, accepted_tokens)
