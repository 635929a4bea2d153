"""What `workbench sweep` checks and reads before its first point runs.

    declared_parameters(nb)    {name: default} of the notebook's papermill `parameters` cell
    check_names(...)           the swept and fixed names are declared there, none both
    kernel_language(nb, kernel)  the kernel's language for a notebook without a kernelspec
                               (--kernel must then be given and installed)
    check_values(nb, ...)      every swept and fixed value against the notebook's declared
                               parameter types (`workbench.sweeps.notebook_specs`): one
                               `NotebookParameterError` naming each problem, nothing run
"""

from __future__ import annotations

import ast
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _literal(source: str) -> Any:
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return source


def declared_parameters(notebook: str | Path, kernel_name: str | None = None,
                        language: str | None = None) -> dict[str, Any]:
    """{name: default value} from the notebook's `parameters` cell ({} without one). A
    notebook without a kernelspec is read as if it had `kernel_name`'s (papermill needs one
    to parse the cell)."""
    import nbformat
    import papermill

    nb = nbformat.read(str(notebook), as_version=4)
    if nb.metadata.get("kernelspec") or not kernel_name:
        found = papermill.inspect_notebook(str(notebook))
    else:
        nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name,
                                     "language": language or "python"}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(notebook).name
            nbformat.write(nb, str(path))
            found = papermill.inspect_notebook(str(path))
    return {name: _literal(str(spec.get("default"))) for name, spec in found.items()}


def kernel_language(nb: Path, kernel_name: str | None) -> str | None:
    """The language to run `nb` with: None when its own kernelspec says (papermill reads
    it), else `kernel_name`'s, which must then be given and installed. `ValueError` naming
    --kernel otherwise."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    has_spec = bool(nbformat.read(str(nb), as_version=4).metadata.get("kernelspec"))
    if kernel_name is None:
        if has_spec:
            return None
        names = sorted(KernelSpecManager().find_kernel_specs())
        raise ValueError(f"notebook {nb.name} has no kernelspec in its metadata: give "
                         f"--kernel NAME (installed kernels: {', '.join(names) or 'none'})")
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        names = sorted(KernelSpecManager().find_kernel_specs())
        raise ValueError(f"--kernel ({kernel_name!r}) is not an installed Jupyter kernel; "
                         f"installed: {', '.join(names) or 'none'}") from None
    return None if has_spec else str(spec.language)


def check_values(nb: Path, declared: dict[str, Any], param: str, values: Sequence[Any],
                 fixed: dict[str, Any]) -> None:
    """Every swept and fixed value against the notebook's `check_params` declaration
    (`workbench.sweeps.notebook_specs`), before anything runs: one `NotebookParameterError`
    naming each bad parameter, its value and what is allowed."""
    from workbench.notebook_params import NotebookParameterError
    from workbench.sweeps.notebook_specs import declared_specs, renamed_parameters, value_problems

    specs = declared_specs(nb)  # a renamed parameter's old name: checked as the new one
    specs.update({old: specs[new] for old, new in renamed_parameters(nb).items() if new in specs})
    problems = value_problems(specs, declared, param, values, fixed)
    if problems:
        raise NotebookParameterError(
            f"{nb.name}: notebook parameter {'; '.join(problems)}; nothing ran")


def check_names(declared: dict[str, Any], param: str, fixed: dict[str, Any], nb: Path) -> None:
    """The swept and fixed names are the notebook's parameters (a renamed one's old name: a
    FutureWarning naming the new one, `notebook_params.renamed_params`), none both."""
    from workbench.sweeps.notebook_specs import renamed_parameters

    if param in fixed:
        raise ValueError(f"param {param!r} is also given in fixed; sweep it or fix it, not both")
    renamed = renamed_parameters(nb) if declared else {}
    for old in [k for k in [param, *fixed] if k in renamed and k not in declared]:
        warnings.warn(f"notebook parameter {old} of {nb.name} is renamed {renamed[old]}; {old} "
                      f"will stop working: pass {renamed[old]}", FutureWarning, stacklevel=2)
    unknown = [k for k in [param, *fixed] if k not in declared and k not in renamed]
    if declared and unknown:
        raise ValueError(f"{unknown} not declared in the parameters cell of {nb.name}; "
                         f"declared: {sorted(declared)}")
