"""`workbench calc ...`: the planning calculator (`workbench.planning`) from the command line.

    workbench calc kv --layers 40 --kv-heads 8 --head-dim 128 --dtype-bytes 2
                      [--block-size 16 --budget-gib 11 --max-model-len 40960 --tp 1]
                      [--kv-cache-dtype int4 --kv-quant-residual-tokens 32 --max-num-seqs 256]
    workbench calc budget --layers 40 --kv-heads 8 --head-dim 128 --dtype-bytes 2
                      --available-gib 38.516 --weights-gib 27.5185 [--activations-gib ...]
    workbench calc blocks --tokens 221 [--block-size 16]
    workbench calc prefix --shared 1530 [--prompt 1590] [--block-size 16]
    workbench calc passes --prompt 12000 --output 100 --budget 4096
    workbench calc decode --weights 16GB [--kv 0.49GiB] --bandwidth 2TB   (bandwidth per second)
    workbench calc spec --acceptance 0.85 --k 5 [--p 0.2 --q 0.5]
    workbench calc spec-counters --drafts 80 --accepted 340 --per-position 70 70 70 70 60
                      [--output-tokens 680]
    workbench calc tp --kv-heads 8 --tp 16
    workbench calc transfer --layers 80 --kv-heads 8 --heads 64 --head-dim 128 --params 70e9
                      --prompt 8192 (--link 400gbe | --bandwidth 50GB) [--links 1]
                      [--latency-ms 0] (--gpu h100-sxm | --peak-tflops 989) [--gpus 8]
                      [--efficiency 0.5] [--dtype-bytes 2]
    workbench calc pd --workers 4 --input-len 1024 --output-len 257 --prefill-tok-s 8192
                      --decode-tok-s 1024 | --decode-tok-s 1:120 8:700 32:1024 (BATCH:TOK_S)
                      [--rate 3] [--kv-bytes-per-token 320KB (--link 400gbe | --bandwidth
                      50GB) [--latency-ms 0]]
    workbench calc roofline (--config DIR|config.json|NAME | --hidden 512 --layers 8 --heads 8
                      --kv-heads 4 --head-dim 64 --intermediate 1408 --vocab 8192)
                      (--requests 128:64 256:32x8 (PROMPT:OUTPUT[xCOUNT]) | --offline-workload
                      SEED) --gflops 350 --bandwidth 25GB [--max-num-batched-tokens 8192]
                      [--max-num-seqs 256] [--dtype-bytes 2] [--kv-dtype-bytes 2] [--steps]

Also `python -m workbench.planning.cli ...`. Sizes take B, KB/MB/GB/TB (10^3) or KiB/MiB/GiB/TiB.
"""

from __future__ import annotations

import argparse
import sys

from workbench import planning
from workbench.planning import commands
from workbench.planning.commands import parse_bytes


def _shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--dtype-bytes", type=int, default=2, help="KV dtype: 2 bf16/fp16, 1 fp8")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="workbench calc", description="Serving arithmetic.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("kv", help="KV bytes per token/block, blocks and capacity in a budget")
    _shape(p)
    p.add_argument("--budget-gib", type=float, default=None, help="KV cache memory in GiB")
    p.add_argument("--tp", type=int, default=1, help="per-rank figures under tensor parallelism")
    p.add_argument("--kv-cache-dtype", default="auto",
                   choices=("auto", "fp8", "fp8_e4m3", "int8", "int4", "int2"),
                   help="auto: --dtype-bytes; int8/int4/int2: KIVI (scales, zeros, residual)")
    p.add_argument("--kv-quant-group-size", type=int, default=None,
                   help="KIVI: value channels per scale and zero (default head_dim)")
    p.add_argument("--kv-quant-residual-tokens", type=int, default=32,
                   help="KIVI: tokens kept full precision (R)")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="KIVI: the residual pool holds max_num_seqs x (ceil(R / bs) + 2) blocks")
    p.set_defaults(run=commands.kv)
    p = sub.add_parser("budget", help="weights + KV + activations + graph + headroom")
    _shape(p)
    p.add_argument("--available-gib", type=float, required=True)
    p.add_argument("--weights-gib", type=float, required=True)
    for name in ("activations", "graph", "headroom"):
        p.add_argument(f"--{name}-gib", type=float, default=0.0)
    p.set_defaults(run=commands.budget)
    p = sub.add_parser("blocks", help="blocks a sequence needs and empty slots in the last")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.set_defaults(run=commands.blocks)
    p = sub.add_parser("prefix", help="prefix-cache hit tokens (full blocks only)")
    p.add_argument("--shared", type=int, required=True, help="shared prefix tokens")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (caps at prompt-1)")
    p.add_argument("--block-size", type=int, default=16)
    p.set_defaults(run=commands.prefix)
    p = sub.add_parser("passes", help="forward passes of one request")
    p.add_argument("--prompt", type=int, required=True)
    p.add_argument("--output", type=int, required=True)
    p.add_argument("--budget", type=int, required=True, help="max_num_batched_tokens")
    p.set_defaults(run=commands.passes)
    p = sub.add_parser("decode", help="memory-bound decode step lower bound")
    p.add_argument("--weights", type=parse_bytes, required=True, help="bytes read per step")
    p.add_argument("--kv", type=parse_bytes, default=0.0, help="KV bytes read per step")
    p.add_argument("--bandwidth", type=parse_bytes, required=True, help="bytes per second")
    p.set_defaults(run=commands.decode)
    p = sub.add_parser("spec", help="speculative acceptance and expected tokens")
    p.add_argument("--acceptance", type=float, default=None)
    p.add_argument("--k", type=int, default=5, help="draft tokens per step")
    p.add_argument("--p", type=float, default=None, help="target probability of the token")
    p.add_argument("--q", type=float, default=None, help="draft probability of the token")
    p.set_defaults(run=commands.spec)
    p = sub.add_parser("spec-counters", help="read vLLM spec_decode counters")
    p.add_argument("--drafts", type=int, required=True)
    p.add_argument("--accepted", type=int, required=True)
    p.add_argument("--per-position", type=int, nargs="+", required=True)
    p.add_argument("--output-tokens", type=int, default=None)
    p.set_defaults(run=commands.spec_counters)
    p = sub.add_parser("tp", help="KV heads per tensor-parallel rank")
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.set_defaults(run=commands.tp)
    p = sub.add_parser("transfer", help="KV transfer over a link vs prefill recompute: "
                       "break-even bandwidth and prompt length")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--heads", type=int, required=True, help="query heads (attention FLOPs)")
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--dtype-bytes", type=int, default=2, help="KV dtype: 2 bf16/fp16, 1 fp8")
    p.add_argument("--params", type=float, required=True,
                   help="weights each token multiplies (no embeddings), e.g. 70e9")
    p.add_argument("--prompt", type=int, required=True, help="prefix tokens moved or redone")
    p.add_argument("--link", default=None, help="preset: " + "; ".join(
        f"{k} {v / 1e9:,.1f} GB/s" for k, (v, _) in planning.LINKS.items()))
    p.add_argument("--bandwidth", type=parse_bytes, default=None, help="bytes per second")
    p.add_argument("--links", type=int, default=1, help="links in parallel (one per GPU)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="fixed cost per transfer")
    p.add_argument("--gpu", default=None, help="preset: " + "; ".join(
        f"{k} {v / 1e12:,.0f} TFLOP/s" for k, v in planning.GPU_PEAK_FLOPS.items()))
    p.add_argument("--peak-tflops", type=float, default=None, help="dense peak per GPU")
    p.add_argument("--gpus", type=int, default=1, help="GPUs sharing the prefill (TP)")
    p.add_argument("--efficiency", type=float, default=planning.DEFAULT_EFFICIENCY,
                   help="share of the peak a prefill sustains (MFU)")
    p.set_defaults(run=commands.transfer)
    p = sub.add_parser("pd", help="prefill:decode split of W disaggregated instances: each "
                       "pool's sustainable request rate per split, the best, the colocated rate")
    p.add_argument("--workers", type=int, required=True, help="instances to split (W >= 2)")
    p.add_argument("--input-len", type=float, required=True, help="mean prompt tokens")
    p.add_argument("--output-len", type=float, required=True,
                   help="mean output tokens (>= 2; the prefill emits the first)")
    p.add_argument("--prefill-tok-s", type=float, required=True,
                   help="prompt tokens/s of one prefill-only instance")
    p.add_argument("--decode-tok-s", nargs="+", required=True, metavar="TOK_S|BATCH:TOK_S",
                   help="output tokens/s of one decode-only instance at its batch, or a curve "
                   "of BATCH:TOK_S points (its best point is used)")
    p.add_argument("--rate", type=float, default=None, help="request rate to meet (req/s)")
    p.add_argument("--kv-bytes-per-token", type=parse_bytes, default=None,
                   help="KV moved per prompt token (see `calc kv`), with --link/--bandwidth")
    p.add_argument("--link", default=None, help="preset, one per prefill instance: "
                   + ", ".join(planning.LINKS))
    p.add_argument("--bandwidth", type=parse_bytes, default=None, help="bytes per second")
    p.add_argument("--latency-ms", type=float, default=0.0, help="fixed cost per transfer")
    p.set_defaults(run=commands.pd)
    p = sub.add_parser("roofline", help="schedule-aware roofline of a workload: per engine step "
                       "max(FLOPs / peak, bytes / bandwidth) over continuous batching")
    p.add_argument("--config", default=None,
                   help="checkpoint folder, its config.json, or a shipped model name")
    for flag, what in (("hidden", "hidden size"), ("layers", "decoder layers"),
                       ("heads", "query heads"), ("kv-heads", "KV heads (default: --heads)"),
                       ("head-dim", "head dim (default: hidden / heads)"),
                       ("intermediate", "MLP intermediate size"), ("vocab", "vocabulary")):
        p.add_argument(f"--{flag}", type=int, default=None, help=what)
    p.add_argument("--requests", nargs="+", default=None, metavar="PROMPT:OUTPUT[xCOUNT]",
                   help="the workload: prompt and output tokens per request (greedy, ignore_eos)")
    p.add_argument("--offline-workload", type=int, default=None, metavar="SEED",
                   help="the offline benchmark's 64 requests drawn with this seed")
    p.add_argument("--gflops", type=float, required=True, help="peak GFLOP/s of the dtype")
    p.add_argument("--bandwidth", type=parse_bytes, required=True,
                   help="memory bandwidth, bytes per second (e.g. 25GB)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="the per-step token budget")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    p.add_argument("--dtype-bytes", type=float, default=2,
                   help="bytes per weight: 4 fp32, 2 bf16/fp16")
    p.add_argument("--kv-dtype-bytes", type=float, default=None,
                   help="bytes per KV element (default: --dtype-bytes)")
    p.add_argument("--steps", action="store_true", help="print every step's cost first")
    p.set_defaults(run=commands.roofline)
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.run(args)
    except ValueError as exc:
        ap.exit(2, f"workbench calc {args.cmd}: {exc}\n")


if __name__ == "__main__":
    main()
