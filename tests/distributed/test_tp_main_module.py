"""`LLM(..., tensor_parallel_size=2)` from a program whose main module a spawned worker cannot
re-run is one clear error saying why and what to do (distributed/main_module.py, executor.py)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from workbench.config.named_models import bundled_checkpoint
from workbench.executor import main_module


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return bundled_checkpoint()

SCRIPT = """\
from workbench import LLM
llm = LLM({model!r}, tensor_parallel_size=2, dtype="float32", max_model_len=64,
          num_gpu_blocks_override=16)
print("built")
"""
ADVICE = ('run the code from a script file (`python script.py`) that builds the LLM under '
          '`if __name__ == "__main__":`, or from a notebook, `python -c` or `workbench serve '
          '--tensor-parallel-size N`.')


def test_script_on_stdin_is_refused_before_spawning(model_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-"], input=SCRIPT.format(model=str(model_dir)),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "built" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "RuntimeError: tensor_parallel_size (2) starts 1 worker process(es) with the 'spawn' "
        "method; this program's main module was read from standard input, and a spawned "
        "worker re-runs the main module, so it cannot start. To use tensor parallelism, "
        + ADVICE)
    assert "closed its pipe" not in proc.stderr  # nothing was spawned


def test_script_without_main_guard_gets_the_advice(model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT.format(model=str(model_dir)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "built" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench.executor.multiproc_executor.WorkerDied: "
                           "tensor-parallel worker rank 1 ")
    assert last.endswith(
        " during start-up (its own error is on stderr above). A spawned worker first re-runs "
        "this program's main module, which must build the LLM only under `if __name__ == "
        '"__main__":`; ' + ADVICE)
    assert "bootstrapping phase" in proc.stderr  # the worker's own error, from multiprocessing


@pytest.mark.parametrize("attrs,problem", [
    ({"__file__": "<stdin>", "__spec__": None}, "read from standard input"),
    ({"__file__": "/no/such/dir/x.py", "__spec__": None},
     "read from '/no/such/dir/x.py', which is not a file"),
    ({"__file__": __file__, "__spec__": None}, None),  # a script file
    ({"__spec__": None}, None),  # the REPL, a notebook kernel, python -c
    ({"__file__": "<stdin>", "__spec__": types.SimpleNamespace(name="m")}, None),  # -m
])
def test_main_module_problem(monkeypatch: pytest.MonkeyPatch, attrs: dict,
                             problem: str | None) -> None:
    main = types.ModuleType("__main__")
    for k, v in attrs.items():
        setattr(main, k, v)
    monkeypatch.setitem(sys.modules, "__main__", main)
    got = main_module.main_module_problem()
    assert (got is None) if problem is None else (problem in str(got))
