"""Can spawned worker processes start from this program? (tensor parallelism's 'spawn')

A spawned process first re-runs the parent's main module (multiprocessing's
`spawn.get_preparation_data`). A module run with `-m` is re-imported by name; a notebook, the
REPL and `python -c` have no path to re-run and need nothing; but a main module whose path is
not a file (a script fed on standard input: `python - <<EOF`) makes every worker die at
start-up, and a script that builds the LLM outside `if __name__ == "__main__":` makes each
worker build one too. vLLM has the same limits; these say why and what to do.
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys

MAIN_ADVICE = (
    "run the code from a script file (`python script.py`) that builds the LLM under "
    "`if __name__ == \"__main__\":`, or from a notebook, `python -c` or `workbench serve "
    "--tensor-parallel-size N`"
)


def main_module_problem() -> str | None:
    """Why spawned workers could not start from this program, or None when they can.

    A spawned process re-runs the parent's main module from its path (multiprocessing's
    `spawn.get_preparation_data`): a module run with `-m` is re-imported by name, and a
    notebook, the REPL or `python -c` has no path to re-run. A path that is not a file
    (`<stdin>`: a script fed on standard input) makes every worker die at start-up."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    full = path
    if not os.path.isabs(full):
        # multiprocessing's start directory, set when it is imported (not in typeshed)
        original_dir: str | None = getattr(multiprocessing.process, "ORIGINAL_DIR", None)
        full = os.path.join(original_dir or os.getcwd(), full)
    if os.path.isfile(full):
        return None
    where = "standard input" if path == "<stdin>" else f"{path!r}, which is not a file"
    return (f"this program's main module was read from {where}, and a spawned worker "
            "re-runs the main module, so it cannot start")
