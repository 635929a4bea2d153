"""Execute every notebook on its defaults and keep the executed copy under docs/notebooks/.

    python scripts/notebooks_docs.py         # every notebooks/NN_*.ipynb (`make notebooks-docs`)
    python scripts/notebooks_docs.py 01 05   # only those whose names start so

Each notebook runs under papermill with no injected parameters (its own defaults: the demo
model, nothing logged to the repo's mlruns/), with cwd notebooks/ as in JupyterLab. The copy
keeps its outputs so GitHub renders it, minus what only adds churn: papermill's per-cell
timings and absolute paths, and any single text output over MAX_TEXT characters (cut, with a
note). Figures stay PNG.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
import papermill

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "docs" / "notebooks"
MAX_TEXT = 20_000  # characters per text output (a stream, a table's HTML or plain text)


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n... ({len(text) - MAX_TEXT} more characters cut)\n"


def tidy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop papermill's timings and paths; cut oversized text outputs."""
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _cut("".join(out["text"]))
            for key, value in out.get("data", {}).items():
                if key.startswith("text/"):
                    out["data"][key] = _cut("".join(value))
    return nb


def execute(src: Path, dest: Path) -> float:
    """Run `src` on its defaults into `dest`; seconds taken."""
    t0 = time.perf_counter()
    papermill.execute_notebook(str(src), str(dest), cwd=str(NOTEBOOKS), kernel_name="python3",
                               progress_bar=False)
    nbformat.write(tidy(nbformat.read(dest, as_version=4)), dest)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="name prefixes (e.g. 01 05); default: every one")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
              if not args.only or any(p.name.startswith(o) for o in args.only)]
    if not chosen:
        print(f"no notebook under {NOTEBOOKS} matches {args.only}", file=sys.stderr)
        return 2
    for src in chosen:
        dest = OUT / src.name
        seconds = execute(src, dest)
        print(f"{dest.relative_to(ROOT)}: {seconds:.0f} s, {dest.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
