"""Our simulator against Vidur on one workload: predicted median / p95 TTFT and median TPOT
side by side (issue 33, "Against Vidur"; docs/simulator_vidur.md).

    make peer-vidur VIDUR_DATA=/path/to/vidur/data      # once: .peers/vidur
    .venv/bin/python scripts/vidur_compare.py [--hardware A100-80GB-SXM] [--qps 4] \
        [--num-requests 256] [--prompt-tokens 512] [--decode-tokens 128] \
        [--scheduler vllm|sarathi] [--max-num-seqs 128] [--max-num-batched-tokens 4096]

Three parts, each printed as it is done:
1. operators: our analytic per-layer GEMM times next to Vidur's profiled ones (its mlp.csv);
2. ours: the workload on our simulator (the real scheduler, the analytic GPU profile);
3. Vidur: the checkout's profiles staged into Vidur's dataset cache (`vidur_data`), the same
   workload replayed as a trace by `python -m vidur.main` in the peer environment, offline
   (HF_HUB_OFFLINE=1), its request_metrics.csv parsed, the table of ratios.
Vidur's profiling data: --vidur-data, else $VIDUR_DATA, else the path `make peer-vidur`
recorded in .peers/vidur/VIDUR_DATA. A part that cannot run says exactly why, and the exit
status is 1; the parts before it are still printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from workbench.platforms.cpu_info import cpu_model_name
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.model_shapes import model_shape
from workbench.sim.vidur_data import missing_profile_files, profile_files, stage_profiles
from workbench.sim.vidur_operators import operator_table, our_operator_ms, vidur_operator_ms
from workbench.sim.vidur_peer import (
    PREDICTORS,
    SCHEDULERS,
    VIDUR_DEVICES,
    VIDUR_MODELS,
    VidurCompareConfig,
    comparison_table,
    find_request_metrics,
    our_num_blocks,
    parse_request_metrics,
    simulate_ours,
    trace_csv,
    vidur_args,
)

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".peers" / "vidur"
OPERATOR_TOKENS = (1, 16, 128, 512, 2048, 4096)


def data_dir(given: str | None) -> Path | None:
    if given:
        return Path(given)
    if os.environ.get("VIDUR_DATA"):
        return Path(os.environ["VIDUR_DATA"])
    recorded = PEER / "VIDUR_DATA"
    return Path(recorded.read_text().strip()) if recorded.is_file() else None


def run_vidur(cfg: VidurCompareConfig, data: Path, python: Path, workdir: Path,
              num_blocks: int, timeout_s: float) -> Path:
    """Run Vidur once; its request_metrics.csv (a RuntimeError with the log's tail else)."""
    workdir.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=workdir)).resolve()
    trace = run / "trace.csv"
    trace.write_text(trace_csv(cfg))
    cache = (workdir / "cache").resolve()
    stage_profiles(cfg, data, cache)  # the checkout's files as the datasets Vidur reads
    args = vidur_args(cfg, trace, run / "out", cache, num_blocks)
    cmd = [str(python), "-m", "vidur.main", *args]
    (run / "command.txt").write_text(" ".join(cmd) + "\n")
    print(f"vidur: HF_HUB_OFFLINE=1 {' '.join(cmd)}", flush=True)
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    log = run / "vidur.log"
    with log.open("w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=run, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Vidur ran past {timeout_s:.0f} s (log: {log})") from None
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"Vidur exited {rc} (log: {log}):\n{tail}")
    return find_request_metrics(run / "out")


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="Llama-2-7B", choices=list(VIDUR_MODELS))
    ap.add_argument("--hardware", default="A100-80GB-SXM", choices=list(VIDUR_DEVICES))
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--qps", type=float, default=4.0)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scheduler", default="vllm", choices=list(SCHEDULERS))
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--predictor", default="random_forrest", choices=list(PREDICTORS))
    ap.add_argument("--vidur-data", default=None, help="a Vidur checkout's data/ folder")
    ap.add_argument("--vidur-python", type=Path, default=PEER / "bin" / "python")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "vidur_compare",
                    help="Vidur's runs and its cache of trained predictors")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for Vidur's run")
    a = ap.parse_args(argv)
    cfg = VidurCompareConfig(
        model=a.model, hardware=a.hardware, num_requests=a.num_requests, qps=a.qps,
        prompt_tokens=a.prompt_tokens, decode_tokens=a.decode_tokens, seed=a.seed,
        scheduler=a.scheduler, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens, predictor=a.predictor)
    print(f"# {cfg}\n# machine: {cpu_model_name()}, {os.cpu_count()} CPUs\n", flush=True)
    data = data_dir(a.vidur_data)
    ok = True

    print("## 1. operators: ours (analytic) vs Vidur's profile\n")
    mlp = profile_files(cfg, data)["compute"] if data else None
    if mlp is None or not mlp.is_file():
        print(f"not run: no Vidur mlp.csv ({mlp or 'VIDUR_DATA not set'})\n")
        ok = False
    else:
        shape = model_shape(cfg.model)
        theirs = vidur_operator_ms(mlp.read_text(), shape, OPERATOR_TOKENS)
        ours_ops = our_operator_ms(AnalyticCostModel(shape, cfg.hardware), OPERATOR_TOKENS)
        print(f"{mlp}\n\n{operator_table(ours_ops, theirs)}\n", flush=True)

    print("## 2. ours: the simulator, analytic profile\n")
    blocks = our_num_blocks(cfg)
    ours = simulate_ours(cfg, blocks)
    print(f"KV pool {blocks} blocks of {cfg.block_size}; {ours}\n", flush=True)

    print("## 3. Vidur\n")
    missing = missing_profile_files(cfg, data) if data else []
    if data is None:
        print("not run: VIDUR_DATA not set (a git clone of microsoft/vidur: its data/)")
        return 1
    if missing:
        print(f"not run: VIDUR_DATA ({data}) lacks {', '.join(map(str, missing))}")
        return 1
    if not a.vidur_python.is_file():
        print(f"not run: no {a.vidur_python} (build it with `make peer-vidur`)")
        return 1
    try:
        metrics = run_vidur(cfg, data, a.vidur_python, a.workdir, blocks, a.timeout)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"FAILED: {e}")
        return 1
    theirs_lat = parse_request_metrics(metrics.read_text())
    print(f"{metrics}; {theirs_lat}\n")
    print(comparison_table(ours, theirs_lat))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
