"""Write the kernel's `language_info` into every paired notebook (notebooks/*.ipynb).

JupyterLab copies the running kernel's `language_info` (ipykernel's: name, version, mimetype,
codemirror mode, ...) into an open notebook's metadata; when the file holds less (jupytext
writes only `{"name": "python"}`), the notebook is marked modified the moment it opens. Run by
`make notebooks` after `jupytext --update`, with the venv's Python: the version written is
this interpreter's (a Python of another patch release still marks it modified on open).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from ipykernel.ipkernel import IPythonKernel


def language_info() -> dict[str, object]:
    """What ipykernel reports for this interpreter (its `kernel_info_reply`)."""
    return dict(IPythonKernel.language_info)


def main(folder: str = "notebooks") -> int:
    info = language_info()
    for path in sorted(Path(folder).glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if nb.metadata.get("language_info") != info:
            nb.metadata["language_info"] = info
            nbformat.write(nb, path)
            print(f"{path}: language_info set")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
