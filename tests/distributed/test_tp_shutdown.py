"""TP worker lifecycle: clean close, errors on either side, a dead parent — no orphans.

Each test starts its own TP=2 engine (a failure kills it). "No orphans" = no child process of
this test process other than multiprocessing's resource tracker (started with the first spawn
and shared by the whole process) is alive a few seconds after close or the exception.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from workbench import LLM, SamplingParams
from workbench.executor.multiproc_executor import WorkerError
from workbench.testing import tiny_checkpoint

ENGINE = dict(dtype="float32", max_model_len=64, block_size=4, max_num_seqs=4,
              num_gpu_blocks_override=64, tensor_parallel_size=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
PROMPT = [[11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tp_shutdown"), arch="llama", seed=0)


def _children() -> list[psutil.Process]:
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(c.cmdline()) and c.status() != "zombie":
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still running (not exited, not zombies) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.engine.runner.executor.procs]  # type: ignore[attr-defined]


def test_budget_sized_pool_then_close_stops_the_workers_cleanly(model: Path) -> None:
    before = {c.pid for c in _children()}
    kwargs = {k: v for k, v in ENGINE.items() if k != "num_gpu_blocks_override"}
    # the pool from a budget: a profile run on both ranks, rank 0 decides, rank 1 allocates
    llm = LLM(model, cpu_memory_budget_bytes=4 << 20, **kwargs)
    procs = llm.engine.runner.executor.procs  # type: ignore[attr-defined]
    assert len(procs) == 1 and procs[0].is_alive()
    readout = llm.memory_readout()
    assert readout["kv_pool_source"] == "cpu_memory_budget_bytes"
    [_, worker] = llm.engine.runner.memory_per_rank()  # type: ignore[attr-defined]
    assert worker["num_blocks"] == readout["num_blocks"] + 1  # + the null block
    assert worker["kv_bytes"] == readout["kv_bytes"]
    tokens = llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    assert len(tokens) == 3
    # one TP group per process: a second TP engine is refused before it spawns anything...
    with pytest.raises(RuntimeError, match="already is a tensor-parallel rank"):
        LLM(model, **ENGINE)
    # ... while a TP=1 engine beside it builds unsharded layers and agrees with it
    single = LLM(model, **{**ENGINE, "tensor_parallel_size": 1})
    assert single.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == tokens
    llm.close()
    llm.close()  # idempotent
    assert procs[0].exitcode == 0  # asked to stop, left the group, exited by itself
    assert {c.pid for c in _children()} == before
    with pytest.raises(RuntimeError, match="tensor-parallel workers have shut down"):
        llm.generate(PROMPT, GREEDY)


def test_worker_exception_is_reraised_on_rank0_with_its_traceback(model: Path) -> None:
    llm = LLM(model, **ENGINE)
    pids = _worker_pids(llm)
    # break rank 1 only: its next forward raises while rank 0 waits in the first all-reduce
    llm.engine.runner.collective_rpc(  # type: ignore[attr-defined]
        "unbind_kv_cache", include_driver=False)
    with pytest.raises(WorkerError) as info:
        llm.generate(PROMPT, GREEDY)
    text = str(info.value)
    assert "tensor-parallel worker rank 1 failed" in text
    assert "Traceback (most recent call last)" in text
    assert "Attention.kv_cache is not bound" in text
    assert _wait_gone(pids) == []
    assert _children() == []


def test_rank0_exception_stops_the_workers(model: Path) -> None:
    llm = LLM(model, **ENGINE)
    pids = _worker_pids(llm)
    llm.engine.runner.unbind_kv_cache()  # rank 0 raises; rank 1 is left in a collective
    with pytest.raises(RuntimeError, match="Attention.kv_cache is not bound") as info:
        llm.generate(PROMPT, GREEDY)
    assert not isinstance(info.value, WorkerError)
    assert _wait_gone(pids) == []
    assert _children() == []


def test_engine_init_error_stops_the_workers(model: Path) -> None:
    kwargs = {k: v for k, v in ENGINE.items() if k != "num_gpu_blocks_override"}
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLM(model, kv_cache_memory_bytes=4096, **kwargs)  # too small for one request
    assert _wait_gone([c.pid for c in _children()]) == []


PARENT = """
import os, signal, sys
from workbench import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="float32", max_model_len=64, block_size=4, max_num_seqs=4,
              num_gpu_blocks_override=64, tensor_parallel_size=2)
    print(llm.engine.runner.executor.procs[0].pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_worker_exits_when_its_parent_is_killed(model: Path, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.run([sys.executable, str(script), str(model)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == -9, proc.stderr[-2000:]
    worker_pid = int(proc.stdout.split()[0])
    assert _wait_gone([worker_pid], timeout_s=5.0) == []
