"""The prefill:decode split of a disaggregated deployment (DistServe / Splitwise, first order):
`pd_ratio` finds the best P:M of W instances for a workload.

DistServe / Splitwise: P prefill instances hand each request's KV to M decode instances.
Each pool must keep up with the arrival rate on its own, so with W = P + M instances:

  per prefill instance  p = prefill_tok_s / input_tokens                  requests/s
                            (and <= 1 / transfer_s when one link per prefill instance
                            carries the KV away: input_tokens x KV bytes/token / bandwidth)
  per decode instance   d = decode_tok_s / (output_tokens - 1)            requests/s
  system(P, M)          = min(P x p, M x d)
  balancing ratio P:M   = d / p   (both pools saturate together: P x p = M x d)
  colocated             = W / (input_tokens / prefill_tok_s + (output_tokens - 1) / decode_tok_s)
                        = W x p x d / (p + d)   (link term aside)

The prefill emits the first output token (as the engine does), so a decode instance
generates output_tokens - 1 tokens per request; that is also what `bench pd-capacity`
measures (decode-only steps). These are capacities at 100% utilization, first order.
Ignored: prefill/decode interference in the colocated case (the reason disaggregation
wins on TTFT/TPOT SLOs: DistServe's goodput), batching effects (a prefill instance's
throughput depends on how many prompts share a step, a decode instance's on its batch,
which the load sets), queueing (latency grows without bound as a pool nears its rate,
so an SLO is met well below it), KV capacity (the batch a decode instance can hold),
the transfer's latency (it adds to TTFT, not to capacity) and the router's cost.
Note that at first order the colocated rate equals the best fractional split, W x p x d /
(p + d): disaggregation wins no raw capacity here, integer splits lose some; what it buys
is the removal of interference, which this arithmetic does not see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.planning.checks import need_int, need_num, need_pos
from workbench.planning.transfer import kv_transfer_time_s


@dataclass(frozen=True)
class PDSplit:
    """One split of the workers: `prefill_instances` + `decode_instances` = num_workers, and
    each pool's sustainable request rate (requests/s). `link_rate` is None without a link."""

    prefill_instances: int
    decode_instances: int
    prefill_rate: float
    decode_rate: float
    link_rate: float | None
    system_rate: float

    @property
    def label(self) -> str:
        """"P:M", e.g. "3:1"."""
        return f"{self.prefill_instances}:{self.decode_instances}"

    @property
    def bottleneck(self) -> str:
        """The pool whose rate is the system's: "prefill", "decode", "link", or "balanced"
        when prefill and decode are equal (within 1e-9) and the link is not lower."""
        rates = {"prefill": self.prefill_rate, "decode": self.decode_rate}
        if self.link_rate is not None:
            rates["link"] = self.link_rate
        if math.isclose(self.prefill_rate, self.decode_rate, rel_tol=1e-9) and (
                self.link_rate is None or self.link_rate >= self.system_rate):
            return "balanced"
        return min(rates, key=lambda k: rates[k])


@dataclass(frozen=True)
class PDRatio:
    """`pd_ratio`'s answer; `rows()` / `table()` print it (one row per split)."""

    num_workers: int
    input_tokens: float
    output_tokens: float
    prefill_tok_s: float
    decode_tok_s: float  # the decode figure used (the best of a curve)
    decode_batch: int | None  # the batch it was measured at (None: a single figure given)
    request_rate: float | None
    transfer_s: float | None  # KV transfer time per request (None without a link)
    prefill_rate_per_instance: float  # p, requests/s (the link bound included)
    decode_rate_per_instance: float  # d, requests/s
    splits: tuple[PDSplit, ...]
    best: PDSplit
    balanced_ratio: float  # P / M = d / p: both pools saturate together
    ideal_rate: float  # W x p x d / (p + d): the best fractional split
    colocated_rate: float  # W instances each doing both phases
    min_prefill_instances: int | None  # ceil(rate / p): the fewest that keep up (with a rate)
    min_decode_instances: int | None  # ceil(rate / d)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per split: split, P, M, the pools' and the system's rates (req/s), the
        bottleneck, best (bool) and, with a request rate, meets_rate (bool)."""
        out = []
        for s in self.splits:
            row: dict[str, Any] = {
                "split": s.label, "prefill_instances": s.prefill_instances,
                "decode_instances": s.decode_instances, "prefill_rate": s.prefill_rate,
                "decode_rate": s.decode_rate}
            if self.transfer_s is not None:
                row["link_rate"] = s.link_rate
            row |= {"system_rate": s.system_rate, "bottleneck": s.bottleneck,
                    "best": s == self.best}
            if self.request_rate is not None:
                row["meets_rate"] = s.system_rate >= self.request_rate
            out.append(row)
        return out

    def table(self) -> str:
        """A Markdown table of `rows()` (rates in req/s, 3 decimals; the best split starred)
        and the summary lines below it."""
        link = self.transfer_s is not None
        rate = self.request_rate is not None
        head = ["P:M", "prefill req/s", "decode req/s", *(["link req/s"] if link else []),
                "system req/s", "bottleneck", *([f"meets {self.request_rate:g} req/s"]
                                                if rate else [])]
        align = ["---", *["---:"] * (len(head) - 2 - rate), "---", *(["---"] if rate else [])]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
        for r, s in zip(self.rows(), self.splits, strict=True):
            cells = [s.label + (" *" if r["best"] else ""), f"{s.prefill_rate:.3f}",
                     f"{s.decode_rate:.3f}"]
            if link:
                cells.append(f"{s.link_rate:.3f}")
            cells += [f"{s.system_rate:.3f}", s.bottleneck]
            if rate:
                cells.append("yes" if r["meets_rate"] else "no")
            lines.append("| " + " | ".join(cells) + " |")
        batch = "" if self.decode_batch is None else f" at batch {self.decode_batch}"
        lines += [
            "",
            f"best split {self.best.label}: {self.best.system_rate:.3f} req/s "
            f"({self.best.bottleneck})",
            f"balancing ratio P:M = {self.balanced_ratio:.3f} (prefill {self.input_tokens:g} "
            f"tokens at {self.prefill_tok_s:g} tok/s; decode {self.output_tokens:g} - 1 tokens "
            f"at {self.decode_tok_s:g} tok/s{batch})",
            f"ideal fractional split: {self.ideal_rate:.3f} req/s; colocated "
            f"({self.num_workers} instances doing both): {self.colocated_rate:.3f} req/s",
        ]
        if self.transfer_s is not None:
            lines.append(f"KV transfer per request: {self.transfer_s * 1e3:.3f} ms (adds to "
                         "TTFT; bounds a prefill instance at 1 / transfer req/s)")
        if self.request_rate is not None:
            lines.append(f"for {self.request_rate:g} req/s: at least "
                         f"{self.min_prefill_instances} prefill + {self.min_decode_instances} "
                         "decode instances")
        return "\n".join(lines)


def _decode_figure(decode_tok_s: float | Mapping[int, float]) -> tuple[float, int | None]:
    """(tokens/s, batch): a single figure as is, a {batch: tokens/s} curve's best point (the
    decode pool's capacity is its best throughput; the load grows the batch to reach it)."""
    if isinstance(decode_tok_s, Mapping):
        if not decode_tok_s:
            raise ValueError("decode_tok_s must be a number or a non-empty {batch: tokens/s} "
                             "mapping, got {}")
        for batch, tps in decode_tok_s.items():
            need_int("decode_tok_s batch", batch, 1)
            need_pos(f"decode_tok_s[{batch}]", tps)
        batch = max(decode_tok_s, key=lambda b: (decode_tok_s[b], -b))
        return float(decode_tok_s[batch]), batch
    need_pos("decode_tok_s", decode_tok_s)
    return float(decode_tok_s), None


def pd_ratio(
    num_workers: int,
    input_tokens: float,
    output_tokens: float,
    prefill_tok_s: float,
    decode_tok_s: float | Mapping[int, float],
    *,
    request_rate: float | None = None,
    kv_bytes_per_token: float | None = None,
    link_bandwidth_bytes_per_s: float | None = None,
    link_latency_s: float = 0.0,
) -> PDRatio:
    """The best prefill:decode split of `num_workers` instances for a workload (DistServe's
    first-order reasoning; formulas and what they ignore above this function).

    input_tokens / output_tokens: mean prompt and output lengths of a request (output >= 2:
    the prefill emits the first token, the decode instance the other output_tokens - 1).
    prefill_tok_s: prompt tokens/s of an instance that only prefills. decode_tok_s: output
    tokens/s of an instance that only decodes, at its decode batch: one figure, or a
    {batch: tokens/s} curve whose best point is taken (reported as `decode_batch`).
    request_rate (req/s, optional): marks the splits that keep up and the fewest instances
    of each pool that would. kv_bytes_per_token with link_bandwidth_bytes_per_s (one link per
    prefill instance, one way) give the KV transfer time per request, input_tokens x KV
    bytes/token / bandwidth + link_latency_s, which bounds a prefill instance at
    1 / transfer_s req/s (transfers overlap the next prefill). Splits run P = 1 .. W - 1;
    the best has the highest system rate, ties going to the more balanced, then to fewer
    prefill instances.
    """
    need_int("num_workers", num_workers, 2)
    need_pos("input_tokens", input_tokens)
    need_num("output_tokens", output_tokens, 2.0)
    if not math.isfinite(output_tokens):
        raise ValueError(f"output_tokens must be a finite number >= 2, got {output_tokens!r}")
    need_pos("prefill_tok_s", prefill_tok_s)
    decode, batch = _decode_figure(decode_tok_s)
    if request_rate is not None:
        need_pos("request_rate", request_rate)
    if (kv_bytes_per_token is None) != (link_bandwidth_bytes_per_s is None):
        raise ValueError("kv_bytes_per_token and link_bandwidth_bytes_per_s go together: give "
                         f"both or neither, got {kv_bytes_per_token!r} and "
                         f"{link_bandwidth_bytes_per_s!r}")
    need_num("link_latency_s", link_latency_s, 0.0)
    transfer_s: float | None = None
    if kv_bytes_per_token is not None and link_bandwidth_bytes_per_s is not None:
        need_pos("kv_bytes_per_token", kv_bytes_per_token)
        transfer_s = kv_transfer_time_s(input_tokens * kv_bytes_per_token,
                                        link_bandwidth_bytes_per_s, link_latency_s)
    compute_p = prefill_tok_s / input_tokens
    link_p = None if transfer_s is None else 1.0 / transfer_s
    p = compute_p if link_p is None else min(compute_p, link_p)
    d = decode / (output_tokens - 1)
    splits = []
    for n_prefill in range(1, num_workers):
        n_decode = num_workers - n_prefill
        link_rate = None if link_p is None else n_prefill * link_p
        pre, dec = n_prefill * compute_p, n_decode * d
        system = min(pre, dec) if link_rate is None else min(pre, dec, link_rate)
        splits.append(PDSplit(n_prefill, n_decode, pre, dec, link_rate, system))
    best = max(splits, key=lambda s: (s.system_rate,
                                      -abs(_prefill_pool_rate(s) - s.decode_rate),
                                      -s.prefill_instances))
    return PDRatio(
        num_workers=num_workers, input_tokens=input_tokens, output_tokens=output_tokens,
        prefill_tok_s=prefill_tok_s, decode_tok_s=decode, decode_batch=batch,
        request_rate=request_rate, transfer_s=transfer_s,
        prefill_rate_per_instance=p, decode_rate_per_instance=d, splits=tuple(splits),
        best=best, balanced_ratio=d / p, ideal_rate=num_workers * p * d / (p + d),
        colocated_rate=num_workers / (input_tokens / prefill_tok_s
                                      + (output_tokens - 1) / decode),
        min_prefill_instances=None if request_rate is None else math.ceil(
            request_rate / p - 1e-12),
        min_decode_instances=None if request_rate is None else math.ceil(
            request_rate / d - 1e-12),
    )


def _prefill_pool_rate(split: PDSplit) -> float:
    """The prefill pool's rate with the link bound: min(prefill_rate, link_rate)."""
    return split.prefill_rate if split.link_rate is None else min(split.prefill_rate,
                                                                   split.link_rate)
