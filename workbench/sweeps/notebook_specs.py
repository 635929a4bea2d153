"""What a notebook declares about its parameters, read from its source without running it.

Place in the flow: `workbench sweep` reads these before the first point runs.

    declared_specs(nb)    {name: Spec} from the notebook's `check_params(globals(), ...)` call
                          (`workbench.notebook_params`): the types and ranges every value of a
                          sweep is checked against up front (`value_problems`)
    sweep_metrics(nb)     the notebook's `SWEEP_METRICS = [...]`: the metric names (or
                          fnmatch patterns, "speedup_c*") its sweep summary, parent metrics
                          and plot show, in that order; None when it declares none
    renamed_parameters(nb)  {old: new} of its `renamed_params(globals(), old="new")` call:
                          the old names a sweep still accepts, with a FutureWarning

The call is read with `ast` and only `workbench.notebook_params`' Spec classes and constants,
literals and `**TRACKING` are evaluated: nothing of the notebook runs. An argument this reader
cannot evaluate leaves that parameter unchecked here (the notebook still checks it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench import notebook_params as np_
from workbench.notebook_params import Spec, parameter_problems

SWEEP_METRICS = "SWEEP_METRICS"
_CONSTANTS = ("BLOCK_SIZES", "CACHE_STATES", "QUANT_VARIANTS", "TRACKING")


class _Unreadable(Exception):
    """An expression outside what `_evaluate` accepts."""


def _code_cells(nb: str | Path) -> Iterator[ast.Module]:
    """Each code cell of the notebook parsed (IPython magics and shell lines dropped)."""
    import nbformat

    for cell in nbformat.read(str(nb), as_version=4).cells:
        if cell.cell_type != "code":
            continue
        lines = [ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        try:
            yield ast.parse("\n".join(lines))
        except SyntaxError:
            continue


def _names() -> dict[str, Any]:
    names: dict[str, Any] = {n: getattr(np_, n) for n in dir(np_)
                             if isinstance(getattr(np_, n), type)
                             and issubclass(getattr(np_, n), Spec)}
    return names


def _evaluate(node: ast.expr, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, names)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_evaluate(e, names) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        if node.id in _CONSTANTS:
            return getattr(np_, node.id)  # QUANT_VARIANTS imports torch: only when used
        raise _Unreadable(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
        args = [_evaluate(a, names) for a in node.args]
        kwargs = {k.arg: _evaluate(k.value, names) for k in node.keywords if k.arg}
        return names[node.func.id](*args, **kwargs)
    raise _Unreadable(ast.dump(node)[:80])


def declared_specs(nb: str | Path) -> dict[str, Spec]:
    """{parameter: Spec} of the notebook's `check_params(globals(), ...)` call ({} without
    one); a parameter whose spec cannot be read statically is left out."""
    names = _names()
    out: dict[str, Spec] = {}
    for tree in _code_cells(nb):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "check_params"):
                continue
            for kw in node.keywords:
                try:
                    value = _evaluate(kw.value, names)
                except (_Unreadable, TypeError, ValueError, ImportError):
                    continue
                if kw.arg is None and isinstance(value, dict):  # **TRACKING
                    out.update({k: v for k, v in value.items() if isinstance(v, Spec)})
                elif kw.arg is not None and isinstance(value, Spec):
                    out[kw.arg] = value
    return out


def renamed_parameters(nb: str | Path) -> dict[str, str]:
    """{old name: new name} of the notebook's `renamed_params(globals(), old="new", ...)`
    call (`workbench.notebook_params`), {} without one."""
    out: dict[str, str] = {}
    for tree in _code_cells(nb):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "renamed_params"):
                out.update({k.arg: k.value.value for k in node.keywords
                            if k.arg and isinstance(k.value, ast.Constant)
                            and isinstance(k.value.value, str)})
    return out


def sweep_metrics(nb: str | Path) -> list[str] | None:
    """The notebook's `SWEEP_METRICS = [...]` (a list of strings), or None."""
    for tree in _code_cells(nb):
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == SWEEP_METRICS):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    return None
                if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
                    return list(value)
    return None


def value_problems(specs: Mapping[str, Spec], defaults: Mapping[str, Any], param: str,
                   values: Sequence[Any], fixed: Mapping[str, Any]) -> list[str]:
    """One line per problem of the swept values and the fixed ones against `specs`: each
    value with the notebook's defaults and `fixed` around it. Only the parameters given
    (`param`, `fixed`) and those whose rule names one of them (`Int(at_least=...)`) are
    judged; each problem once."""
    given = {param, *fixed}
    judged = {n: s for n, s in specs.items()
              if n in given or getattr(s, "at_least", None) in given}
    out: list[str] = []
    for value in values:
        namespace = {**defaults, **fixed, param: value}
        for line in parameter_problems(namespace, judged):
            if line not in out:
                out.append(line)
    return out
