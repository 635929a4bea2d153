"""What each `workbench calc` subcommand computes and prints (the parser is `planning.cli`),
and the value parsers its flags use: sizes ("16GB", "0.49GiB"), decode curves ("8:700"),
workloads ("128:64x8").
"""

from __future__ import annotations

import argparse
import math
import re

from workbench import planning
from workbench.core.kv_cache import utils as kv_utils
from workbench.metrics import spec_decode

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> float:
    """'16GB' -> 16e9, '0.49GiB' -> 0.49 x 2^30, '1024' -> 1024 bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: use a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def _rows(rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        if isinstance(value, float):
            value = f"{value:,.4f}".rstrip("0").rstrip(".")
        elif isinstance(value, int):
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")


def _gib(n: float) -> int:
    return round(n * planning.GiB)


def kv(a: argparse.Namespace) -> None:
    heads = kv_utils.tp_kv_heads_per_rank(a.kv_heads, a.tp)
    b = planning.kv_cache_bytes(
        a.layers, heads, a.head_dim, a.dtype_bytes, a.block_size, a.kv_cache_dtype,
        a.kv_quant_group_size, a.kv_quant_residual_tokens, a.max_num_seqs)
    per_block, residual = int(b["kv_bytes_per_block"]), int(b["kv_residual_bytes"])
    rows: list[tuple[str, object]] = []
    if a.tp > 1:
        rows.append(("kv heads per rank", heads))
    rows += [("kv bytes/token", b["kv_bytes_per_token"]), ("kv bytes/block", per_block)]
    if a.kv_cache_dtype in kv_utils.KIVI_KV_BITS:  # KIVI: scales, zeros and the residual pool
        rows += [("kv bytes/token/layer", b["kv_bytes_per_token_per_layer"]),
                 ("scale+zero bytes/block", b["kv_scale_bytes_per_block"]),
                 (f"residual pool ({b['kv_residual_slots']} blocks) bytes", residual)]
    if a.budget_gib is not None:
        budget_bytes = _gib(a.budget_gib)
        if budget_bytes < residual:
            raise SystemExit(f"calc kv: --budget-gib {a.budget_gib} is smaller than the KIVI "
                             f"residual pool ({residual} bytes)")
        blocks = kv_utils.num_blocks_for_budget(budget_bytes - residual, per_block)
        capacity = planning.kv_token_capacity(blocks, a.block_size)
        rows += [("blocks", blocks), ("token capacity", capacity)]
        if a.max_model_len is not None:
            conc = kv_utils.max_concurrency(blocks, a.block_size, a.max_model_len)
            rows.append((f"max concurrency @ {a.max_model_len:,}", f"{conc:.2f}x"))
    _rows(rows)


def budget(a: argparse.Namespace) -> None:
    per_token = kv_utils.kv_bytes_per_token(a.layers, a.kv_heads, a.head_dim, a.dtype_bytes)
    r = planning.memory_budget(
        _gib(a.available_gib), _gib(a.weights_gib), per_token, a.block_size,
        activation_bytes=_gib(a.activations_gib), graph_reserve_bytes=_gib(a.graph_gib),
        headroom_bytes=_gib(a.headroom_gib), max_model_len=a.max_model_len,
    )
    labels = {"available_bytes": "available", "weight_bytes": "weights",
              "kv_cache_bytes": "kv cache", "activation_bytes": "activations",
              "graph_reserve_bytes": "graph reserve", "headroom_bytes": "headroom"}
    rows: list[tuple[str, object]] = [
        (f"{label} GiB", f"{(r[key] or 0) / planning.GiB:.4f}") for key, label in labels.items()
    ]
    rows += [("weights + kv GiB", f"{r['weight_plus_kv_gib']:.4f}"),
             ("kv bytes/block", r["kv_bytes_per_block"]), ("kv blocks", r["kv_num_blocks"]),
             ("kv token capacity", r["kv_token_capacity"])]
    if r["max_concurrency"] is not None:
        rows.append((f"max concurrency @ {a.max_model_len:,}", f"{r['max_concurrency']:.2f}x"))
    _rows(rows)


def blocks(a: argparse.Namespace) -> None:
    _rows([("blocks", kv_utils.blocks_needed(a.tokens, a.block_size)),
           ("last block free slots", planning.last_block_free_slots(a.tokens, a.block_size))])


def prefix(a: argparse.Namespace) -> None:
    hit = planning.prefix_cache_hit_tokens(a.shared, a.block_size, a.prompt)
    rows: list[tuple[str, object]] = [("prefix hit tokens", hit)]
    if a.prompt is not None:
        rows.append(("tokens to prefill", a.prompt - hit))
    _rows(rows)


def passes(a: argparse.Namespace) -> None:
    total = planning.forward_passes(a.prompt, a.output, a.budget)  # validates the arguments
    chunks = kv_utils.cdiv(a.prompt, a.budget)
    _rows([("prefill chunks", chunks), ("decode passes", total - chunks),
           ("forward passes", total)])


def decode(a: argparse.Namespace) -> None:
    step = planning.decode_step_lower_bound_s(a.weights, a.kv, a.bandwidth)
    _rows([("step lower bound ms", step * 1e3), ("tokens/s per request upper bound", 1 / step)])


def spec(a: argparse.Namespace) -> None:
    rows: list[tuple[str, object]] = []
    if a.p is not None or a.q is not None:
        if a.p is None or a.q is None:
            raise SystemExit("calc spec: give both --p and --q")
        rows.append(("acceptance prob min(1, p/q)", planning.spec_acceptance_prob(a.p, a.q)))
    if a.acceptance is not None:
        rows.append(("expected tokens/verification",
                     planning.spec_expected_tokens(a.acceptance, a.k)))
    if not rows:
        raise SystemExit("calc spec: give --acceptance (and --k) or --p and --q")
    _rows(rows)


def spec_counters(a: argparse.Namespace) -> None:
    k = len(a.per_position)
    counts = spec_decode.accepted_length_counts(a.drafts, a.per_position)
    rows: list[tuple[str, object]] = [
        ("acceptance rate", a.accepted / (a.drafts * k)),
        ("mean acceptance length", spec_decode.mean_acceptance_length(a.drafts, a.accepted)),
    ]
    rows += [(f"P(accepted = {i})", f"{n / a.drafts:.4f} ({n:,} drafts)")
             for i, n in enumerate(counts)]
    if sum(i * n for i, n in enumerate(counts)) != a.accepted:
        rows.append(("warning", "per-position counters do not sum to --accepted"))
    if a.output_tokens is not None:
        fwd = planning.spec_forward_passes(a.output_tokens, a.drafts, a.accepted)
        rows += [("decode forwards", fwd), ("without speculation", a.output_tokens),
                 ("predicted speed-up", f"{a.output_tokens / fwd:.2f}x")]
    _rows(rows)


def tp(a: argparse.Namespace) -> None:
    heads = kv_utils.tp_kv_heads_per_rank(a.kv_heads, a.tp)
    mode = "sharded" if a.tp <= a.kv_heads else f"replicated x{a.tp // a.kv_heads}"
    _rows([("kv heads per rank", heads), ("layout", mode)])


def transfer(a: argparse.Namespace) -> None:
    if (a.link is None) == (a.bandwidth is None):
        raise ValueError(f"give --link (one of {sorted(planning.LINKS)}) or --bandwidth, not both "
                         "or neither")
    if (a.gpu is None) == (a.peak_tflops is None):
        raise ValueError(f"give --gpu (one of {sorted(planning.GPU_PEAK_FLOPS)}) or --peak-tflops, "
                         "not both or neither")
    for name in ("links", "gpus"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name} must be an integer >= 1, got {getattr(a, name)}")
    one_link = planning.link_bandwidth(a.link) if a.link else a.bandwidth
    one_gpu = planning.gpu_peak_flops(a.gpu) if a.gpu else a.peak_tflops * 1e12
    r = planning.kv_transfer_break_even(
        num_layers=a.layers, num_kv_heads=a.kv_heads, num_heads=a.heads, head_dim=a.head_dim,
        dtype_bytes=a.dtype_bytes, num_params=a.params, prompt_tokens=a.prompt,
        bandwidth_bytes_per_s=one_link * a.links, peak_flops=one_gpu * a.gpus,
        efficiency=a.efficiency, latency_s=a.latency_ms / 1e3)
    bw, tokens = r["break_even_bandwidth_bytes_per_s"], r["break_even_tokens"]
    faster = "transfer" if r["winner"] == "transfer" else "recompute"
    ratio = r["speedup"] if faster == "transfer" else 1 / r["speedup"]
    _rows([
        ("kv bytes/token", r["kv_bytes_per_token"]),
        ("kv GB", r["kv_bytes"] / 1e9),
        ("link GB/s", one_link * a.links / 1e9),
        ("transfer ms", r["transfer_s"] * 1e3),
        ("prefill TFLOPs (linear + attention)",
         f"{r['prefill_flops'] / 1e12:,.1f} ({r['linear_flops'] / 1e12:,.1f} + "
         f"{r['attention_flops'] / 1e12:,.1f})"),
        ("sustained TFLOP/s", one_gpu * a.gpus * a.efficiency / 1e12),
        ("recompute ms", r["recompute_s"] * 1e3),
        ("faster", "tie" if r["winner"] == "tie" else f"{faster} ({ratio:.2f}x)"),
        ("break-even link GB/s", "never (latency >= recompute)" if math.isinf(bw)
         else f"{bw / 1e9:,.2f}"),
        ("transfer wins above tokens", "any length" if tokens == 0 else f"{tokens:,.1f}"),
    ])


def parse_decode_tok_s(items: list[str]) -> float | dict[int, float]:
    """["1024"] -> 1024.0; ["1:120", "8:700"] -> {1: 120.0, 8: 700.0} (batch: tokens/s)."""
    if len(items) == 1 and ":" not in items[0]:
        return _number("--decode-tok-s", items[0])
    curve: dict[int, float] = {}
    for item in items:
        batch, sep, tps = item.partition(":")
        if not sep or not batch.strip().isdigit() or int(batch) < 1:
            raise ValueError(f"--decode-tok-s {item!r} must be BATCH:TOK_S with BATCH an "
                             "integer >= 1 (or one number: tokens/s at the decode batch)")
        curve[int(batch)] = _number(f"--decode-tok-s {item!r}", tps)
    return curve


def _number(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{flag} must be a number, got {text!r}") from None


def pd(a: argparse.Namespace) -> None:
    if a.kv_bytes_per_token is None and (a.link is not None or a.bandwidth is not None):
        raise ValueError("--link / --bandwidth need --kv-bytes-per-token (the KV moved per "
                         "prompt token)")
    bandwidth = None
    if a.kv_bytes_per_token is not None:
        if (a.link is None) == (a.bandwidth is None):
            raise ValueError(f"--kv-bytes-per-token needs --link (one of {sorted(planning.LINKS)}) "
                             "or --bandwidth, not both or neither")
        bandwidth = planning.link_bandwidth(a.link) if a.link else a.bandwidth
    try:
        r = planning.pd_ratio(a.workers, a.input_len, a.output_len, a.prefill_tok_s,
                          parse_decode_tok_s(a.decode_tok_s), request_rate=a.rate,
                          kv_bytes_per_token=a.kv_bytes_per_token,
                          link_bandwidth_bytes_per_s=bandwidth,
                          link_latency_s=a.latency_ms / 1e3)
    except ValueError as exc:  # name the flag, not the function's argument
        text = str(exc)
        for arg, flag in _PD_FLAGS.items():
            if text.startswith(arg + " "):
                text = flag + text[len(arg):]
        raise ValueError(text) from None
    print(r.table())


def parse_requests(items: list[str]) -> list[tuple[int, int]]:
    """["128:64", "32:16x3"] -> [(128, 64), (32, 16), (32, 16), (32, 16)]
    (PROMPT:OUTPUT, optionally xCOUNT copies)."""
    out: list[tuple[int, int]] = []
    for item in items:
        m = re.fullmatch(r"\s*(\d+):(\d+)(?:x(\d+))?\s*", item)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1 or m.group(3) == "0":
            raise ValueError(f"--requests {item!r} must be PROMPT:OUTPUT or PROMPT:OUTPUTxCOUNT "
                             "with positive integers, e.g. 128:64 or 128:64x16")
        out += [(int(m.group(1)), int(m.group(2)))] * int(m.group(3) or 1)
    return out


_SHAPE_FLAGS = {"hidden_size": "hidden", "num_layers": "layers", "num_heads": "heads",
                "num_kv_heads": "kv_heads", "head_dim": "head_dim",
                "intermediate_size": "intermediate", "vocab_size": "vocab"}


def _roofline_shape(a: argparse.Namespace) -> planning.DecoderShape:
    given = {k: getattr(a, v) for k, v in _SHAPE_FLAGS.items() if getattr(a, v) is not None}
    if (a.config is None) == (not given):
        raise ValueError("give --config (a checkpoint folder, its config.json or a shipped "
                         "model name) or the shape flags (--hidden --layers --heads "
                         "--kv-heads --head-dim --intermediate --vocab), not both or neither")
    if a.config is not None:
        from workbench.config.named_models import resolve_model

        try:
            return planning.DecoderShape.from_checkpoint(resolve_model(a.config))
        except (OSError, ValueError, KeyError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"--config {a.config!r}: no readable Llama-style config.json "
                             f"({type(exc).__name__}: {exc})") from None
    missing = [f"--{v.replace('_', '-')}" for k, v in _SHAPE_FLAGS.items() if k not in given
               and not (k == "num_kv_heads" or k == "head_dim")]
    if missing:
        raise ValueError(f"the shape needs {', '.join(missing)} too")
    heads = given["num_heads"]
    given.setdefault("num_kv_heads", heads)
    given.setdefault("head_dim", given["hidden_size"] // heads)
    return planning.DecoderShape(**given)


def roofline(a: argparse.Namespace) -> None:
    if (a.requests is None) == (a.offline_workload is None):
        raise ValueError("give --requests PROMPT:OUTPUT[xCOUNT] ... or --offline-workload "
                         "SEED, not both or neither")
    if a.requests is not None:
        requests = parse_requests(a.requests)
    else:
        from workbench.harness.offline_workload import make_offline_workload

        requests = [(len(r.prompt_token_ids), r.max_tokens)
                    for r in make_offline_workload(a.offline_workload)]
    r = planning.schedule_roofline(
        _roofline_shape(a), requests, a.max_num_batched_tokens, a.max_num_seqs, a.gflops,
        a.bandwidth / 1e9, a.dtype_bytes, kv_dtype_bytes=a.kv_dtype_bytes)
    if a.steps:
        print("| step | decodes | prefill tokens | sampled | MFLOP | MB moved | compute ms "
              "| memory ms | bound |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for i, s in enumerate(r.steps):
            print(f"| {i} | {s.num_decodes} | {s.num_prefill_tokens} | {s.num_samples} | "
                  f"{s.flops / 1e6:,.1f} | {s.bytes / 1e6:,.2f} | {s.compute_s * 1e3:.4f} | "
                  f"{s.memory_s * 1e3:.4f} | {s.bound} |")
        print()
    _rows([
        ("requests", len(requests)),
        ("prompt + output tokens", f"{r.prompt_tokens:,} + {r.output_tokens:,}"),
        ("engine steps", len(r.steps)),
        ("compute-bound steps", r.compute_bound_steps),
        ("bandwidth-bound steps", r.bandwidth_bound_steps),
        ("GFLOP", r.total_flops / 1e9),
        ("GB moved", r.total_bytes / 1e9),
        ("lower bound s", r.seconds),
        ("output tok/s bound", r.output_tok_s),
        ("output tok/s, FLOPs alone", r.compute_only_output_tok_s),
    ])


_PD_FLAGS = {"num_workers": "--workers", "input_tokens": "--input-len",
             "output_tokens": "--output-len", "prefill_tok_s": "--prefill-tok-s",
             "decode_tok_s": "--decode-tok-s", "request_rate": "--rate",
             "kv_bytes_per_token": "--kv-bytes-per-token",
             "link_bandwidth_bytes_per_s": "--bandwidth", "link_latency_s": "--latency-ms (s)"}
