"""The architecture's figures, read from the source: what docs/architecture.md reports before and
after a restructuring step (issue 32).

    python scripts/architecture_figures.py [--json OUT.json]

Prints, for the non-test code under workbench/ and kernels/:
- lines per layer (the layering test's LAYERS; the shared leaves counted apart),
- the files over 300 lines and the longest functions (top 10),
- the exempt shared leaves (count and lines),
- upward imports: how many imports would point up if the leaves were placed in the layer of
  their package (what the leaf exemption hides), and how many point up with it (must be 0),
- `# type: ignore` comments, and how many of them name an error code,
- the modules and their count at the package root,
- the files that name each traced knob (`max_num_batched_tokens`, `num_speculative_tokens`)
  or one of its aliases, from notebooks/ down to workbench/ (a file crossed by the knob's
  route mentions it; a grep, so an upper bound on the route's length).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_layers import (  # noqa: E402 - the layering test owns the layer mapping
    LAYER_NAMES,
    LAYERS,
    LEAVES,
    _match,
    all_modules,
    check,
    scan,
)

KNOBS = {
    "max_num_batched_tokens": ("max_num_batched_tokens", "baseline_budget", "token_budget"),
    "num_speculative_tokens": ("num_speculative_tokens", "num_spec_tokens", "spec_k"),
}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _layer_without_leaves(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for name, rules in LAYERS:
        rule = _match(module, rules)
        if rule is not None and (best is None or len(rule) > best[0]):
            best = (len(rule), name)
    return best[1] if best else None


def _functions(path: Path, module: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            out.append((end - node.lineno + 1, f"{module}.{node.name}"))
    return out


def figures() -> dict[str, Any]:
    mods = all_modules()
    leaves = [m for m in mods if _match(m, LEAVES)]
    per_layer: dict[str, int] = {name: 0 for name in LAYER_NAMES}
    per_layer["leaf"] = 0
    for m, p in mods.items():
        layer = "leaf" if m in leaves else _layer_without_leaves(m)
        if layer is not None:
            per_layer[layer] += _lines(p)
    sizes = sorted(((_lines(p), m) for m, p in mods.items()), reverse=True)
    funcs = sorted((f for m, p in mods.items() for f in _functions(p, m)), reverse=True)
    imports = scan()
    hidden = 0
    for imp in imports:
        src, dst = _layer_without_leaves(imp.importer), _layer_without_leaves(imp.imported)
        if src and dst and LAYER_NAMES.index(dst) < LAYER_NAMES.index(src):
            hidden += 1
    ignores = coded = 0
    for p in mods.values():
        for line in p.read_text().splitlines():
            if "# type: ignore" in line:
                ignores += 1
                coded += "# type: ignore[" in line
    root_modules = sorted(p.name for p in (ROOT / "workbench").glob("*.py"))
    knob_files: dict[str, list[str]] = {}
    for knob, names in KNOBS.items():
        pattern = re.compile("|".join(re.escape(n) for n in names))
        hits = []
        for p in sorted([*(ROOT / "workbench").rglob("*.py"), *(ROOT / "notebooks").glob("*.py"),
                         *(ROOT / "experiments").glob("*.yaml")]):
            if pattern.search(p.read_text()):
                hits.append(str(p.relative_to(ROOT)))
        knob_files[knob] = hits
    return {
        "non_test_lines": sum(per_layer.values()),
        "lines_per_layer": per_layer,
        "files_over_300_lines": [{"lines": n, "module": m} for n, m in sizes if n > 300],
        "longest_functions": [{"lines": n, "function": f} for n, f in funcs[:10]],
        "exempt_leaves": {"count": len(leaves),
                          "lines": sum(_lines(mods[m]) for m in leaves),
                          "modules": sorted(leaves)},
        "upward_imports_with_leaves_exempt": len(check(imports)),
        "upward_imports_if_leaves_were_placed": hidden,
        "type_ignores": {"total": ignores, "with_error_code": coded},
        "package_root_modules": {"count": len(root_modules), "modules": root_modules},
        "knob_files": {k: {"count": len(v), "files": v} for k, v in knob_files.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    f = figures()
    print(f"non-test lines: {f['non_test_lines']}")
    print("lines per layer: " + ", ".join(f"{k} {v}" for k, v in f["lines_per_layer"].items()))
    over = f["files_over_300_lines"]
    print(f"files over 300 lines: {len(over)} (largest: "
          + ", ".join(f"{o['module']} {o['lines']}" for o in over[:5]) + ")")
    print("longest functions: " + ", ".join(f"{o['function']} {o['lines']}"
                                            for o in f["longest_functions"][:5]))
    leaves = f["exempt_leaves"]
    print(f"exempt leaves: {leaves['count']} modules, {leaves['lines']} lines")
    print(f"upward imports: {f['upward_imports_with_leaves_exempt']} with the leaves exempt, "
          f"{f['upward_imports_if_leaves_were_placed']} if the leaves sat in their packages")
    ti = f["type_ignores"]
    print(f"# type: ignore: {ti['total']} ({ti['with_error_code']} name an error code)")
    print(f"package root modules: {f['package_root_modules']['count']}")
    for knob, v in f["knob_files"].items():
        print(f"files naming {knob} (or an alias): {v['count']}")
    if args.json:
        args.json.write_text(json.dumps(f, indent=2))


if __name__ == "__main__":
    main()
