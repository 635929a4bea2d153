"""Layers that point one way: every import under workbench/ and kernels/, read from the source.

The layers, top to bottom (docs/architecture.md draws them). A module may import its own layer
or any layer below it, never one above:

    entrypoints -> experiments -> benchmarks -> simulator -> harness
        -> engine -> executor -> worker -> model
                                    |
        core (Request, Scheduler, SchedulerOutput, KV cache)
                                    |
                             metrics, config
                                    |
                                 kernels

Shared leaves (LEAVES below) carry what every layer needs and no layer owns (errors, NVTX
ranges, calc helpers, the model registry's table): any layer may import them, and they import
only other leaves, the standard library and third-party packages. The data that crosses the
engine/worker boundary (Request, SchedulerOutput, ModelRunnerOutput) is the core layer.

Every import counts: module level, inside functions (lazy) and under `if TYPE_CHECKING:`.
The mapping lives here and nowhere else; a module no rule covers fails `test_every_module_
has_a_layer`, so a new package has to be placed on purpose.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workbench", "kernels")

# Top to bottom. Each rule is a module name or a package prefix ("workbench.server" covers
# workbench.server and workbench.server.*), except "<package>.__init__", which covers the
# package's own __init__.py only. The longest matching rule wins, so a module can be
# placed apart from its package (kv_transfer.metadata sits with the core, below the rest of
# distributed).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Processes and front doors: the CLI verbs, the OpenAI server, the router, the sweep and
    # demo scripts, the bench CLI. Nothing imports them but each other.
    ("entrypoints", (
        "workbench.cli",
        "workbench.planning.cli",  # `workbench calc`: its parser
        "workbench.planning.commands",  # and its subcommands (roofline reads the offline workload)
        "workbench.demo",
        "workbench.sweeps",  # `workbench sweep`: papermill notebooks, one MLflow run each
        "workbench.server",
        "workbench.router",
        "workbench.entrypoints",  # shared by server and router: cli_args (serve's flags)
        "workbench.bench.cli",
    )),
    # Questions and answers: experiment templates, runner, verdicts, the quality gate;
    # notebook helpers (analysis frames and plots, notebook parameter checks); MLflow tracking.
    ("experiments", (
        "workbench.experiments",
        "workbench.analysis",
        "workbench.tracking",
        "workbench.notebook_params",
    )),
    # Benchmark scripts: the engine against its peers (offline, peers, spec, quant) and the
    # micro-benchmarks (scheduler step, KV-cache bookkeeping, TP collectives, the GPU check).
    ("benchmarks", (
        "workbench.bench",
    )),
    # The simulator (issue 33): the core's scheduler and KV cache manager on a virtual clock,
    # step times from a cost model (analytic GPU profiles or one calibrated on this machine's
    # engine), records in the harness's format. Torch-free except the calibration profiler,
    # which drives the engine.
    ("simulator", (
        "workbench.sim",
    )),
    # The measuring library: workloads, arrivals, targets, runner, metrics, Prometheus, SSE,
    # validity, join, server processes.
    ("harness", (
        "workbench.harness",
    )),
    # The OpenAI protocol (vLLM's entrypoints/openai/protocol): request and response models,
    # errors, SSE (encoded by the server and the router, decoded by the router and the
    # harness's HTTP client), the prompt's token ids, the detokenizer, the API key, the HTTP
    # body and streaming helpers. Below the harness, and it imports nothing of workbench
    # outside itself (tests/entrypoints/test_boundaries.py).
    ("protocol", (
        "workbench.entrypoints.openai.protocol",
    )),
    # The planning calculator (`workbench calc`): memory budgets, KV transfer against
    # recompute, the P:D split, the schedule-aware roofline. Pure Python; builds on the core's
    # KV arithmetic; read by the harness (predicted speed-ups), analysis and the benchmarks.
    ("planning", (
        "workbench.planning",
    )),
    # Request lifecycle: LLM, LLMEngine, AsyncEngine, the Processor, outputs; engine/arg_utils
    # turns the config dataclasses into CLI flags (vLLM's EngineArgs). The package root
    # `workbench/__init__.py` is the public facade (lazily re-exports LLM and the outputs), so it
    # sits here too. The scheduler and the KV-cache manager are the core, below the worker.
    ("engine", (
        "workbench.__init__",
        "workbench.engine",  # engine/arg_utils turns the config knobs into CLI flags
    )),
    # How workers are started and reached: the multiprocess executor and the driver-side TP
    # runner that fans a step out to it.
    ("executor", (
        "workbench.executor",
    )),
    # One device's forward: model runner, CUDA graphs, the TP worker process, speculative
    # proposers (n-gram, draft model).
    ("worker", (
        "workbench.worker",
        "workbench.spec_decode",
        "workbench.compilation",  # torch.compile of the model forward (the runner wraps it)
    )),
    # Architectures and their building blocks: models/, layers/ (linear, norm, rotary,
    # quantization), attention/ backends, sample/ (vLLM's v1/sample: the sampler, its
    # metadata, the rejection sampler), and the TP group state and collectives the parallel
    # layers call.
    ("model", (
        "workbench.models",
        "workbench.layers",
        "workbench.attention",
        "workbench.sample",
        "workbench.distributed",  # parallel_state, communication_op
    )),
    # The torch-free engine core (vLLM's v1/core, v1/request.py, v1/outputs.py): Request, the
    # Scheduler and its queues, SchedulerOutput (the one step message, in-process and to every
    # TP rank), ModelRunnerOutput, the KV-cache manager; with the data they carry: the
    # SamplingParams a request asks for and the KV connector's step metadata and output.
    ("core", (
        "workbench.core",
        "workbench.sampling_params",  # vLLM's place (the package root); data of a Request
        "workbench.distributed.kv_transfer.metadata",  # KVConnectorMetadata/Output: both sides
    )),
    # Metrics (vLLM's v1/metrics): the metric registry, the engine's and scheduler's stats,
    # the stat logger, the spec-decode counters' read-out. Torch-free; read by the scheduler,
    # the engine, the server, the harness and the verdict; imports only leaves.
    ("metrics", (
        "workbench.metrics",
    )),
    # Configuration (vLLM's vllm/config): the config dataclasses, the measured compile default,
    # the shipped model names; and the machine facts (platforms/cpu_info) that default and the
    # linear autotune are keyed by. Torch-free at import; every layer above reads it.
    ("config", (
        "workbench.config",
        "workbench.platforms",
    )),
    # Triton and C++ kernels with their torch twins and the quantized formats' references.
    # Imports nothing from workbench/.
    ("kernels", (
        "kernels",
    )),
)

# Shared leaves: importable from every layer; they import only other leaves.
LEAVES: tuple[str, ...] = (
    "workbench.models.registry",  # architecture -> (module, class): config validates with it
    "workbench.testing",  # tiny checkpoints named_models builds on demand; the demo pair trainer
    "workbench.errors",  # UserError / TemplateError: every layer refuses bad input with them
    "workbench.profiling",  # NVTX ranges, used from the engine down to the runner
)

# Upward imports that need a move larger than this test's change. (importer, imported), both
# module names. The list may only shrink: a pair that no longer exists fails the test too.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()

# Import cycles (strongly connected groups of modules, every kind of import counted) not yet
# broken; shrink-only. None left.
KNOWN_CYCLES: tuple[tuple[str, ...], ...] = ()

LAYER_NAMES = tuple(name for name, _ in LAYERS)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    return {
        module_name(p, root): p
        for pkg in PACKAGES
        for p in sorted((root / pkg).rglob("*.py"))
    }


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """The workbench/kernels modules `source` imports. `from a import b` names module `a.b`
    when `a.b` is a known module, else `a`."""
    out: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in known else target
                for a in node.names
            ]
        else:
            continue
        for t in targets:
            if t.split(".")[0] in PACKAGES and t != module:
                out.append(Import(module, t, node.lineno))
    return out


def _covers(rule: str, module: str) -> bool:
    if rule.endswith(".__init__"):
        return module + ".__init__" == rule
    return module == rule or module.startswith(rule + ".")


def _match(module: str, rules: tuple[str, ...]) -> str | None:
    hits = [r for r in rules if _covers(r, module)]
    return max(hits, key=len) if hits else None


def layer_of(module: str) -> str | None:
    """'leaf', a name from LAYER_NAMES, or None when no rule covers `module`."""
    best: tuple[int, str] | None = None
    for name, rules in (*LAYERS, ("leaf", LEAVES)):
        rule = _match(module, rules)
        if rule is not None and (best is None or len(rule) > best[0]):
            best = (len(rule), name)
    return best[1] if best else None


def violation(imp: Import) -> str | None:
    """Why `imp` breaks the layering, or None when it is allowed."""
    src, dst = layer_of(imp.importer), layer_of(imp.imported)
    if src is None or dst is None:
        return None  # reported by test_every_module_has_a_layer
    if src == "leaf":
        if dst != "leaf":
            return f"shared leaf imports the {dst} layer"
        return None
    if dst == "leaf":
        return None
    if LAYER_NAMES.index(dst) < LAYER_NAMES.index(src):
        return f"{src} imports {dst}, which sits above it"
    return None


def scan(root: Path = ROOT) -> list[Import]:
    mods = all_modules(root)
    known = set(mods)
    return [
        imp
        for mod, path in mods.items()
        for imp in imports_of(mod, path.read_text(), path.name == "__init__.py", known)
    ]


def check(imports: list[Import]) -> list[tuple[Import, str]]:
    return [(imp, why) for imp in imports if (why := violation(imp)) is not None]


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
        graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# --------------------------------------------------------------------------- the tree


@pytest.fixture(scope="module")
def tree_imports() -> list[Import]:
    return scan()


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in all_modules() if layer_of(m) is None)
    assert not missing, f"place these modules in LAYERS or LEAVES of {__file__}: {missing}"


def test_imports_point_down(tree_imports: list[Import]) -> None:
    found = check(tree_imports)
    new = [
        f"{imp.importer}:{imp.line} -> {imp.imported} ({why})"
        for imp, why in found
        if (imp.importer, imp.imported) not in KNOWN_VIOLATIONS
    ]
    assert not new, "imports against the layers (see docs/architecture.md):\n" + "\n".join(new)


def test_known_violations_still_exist(tree_imports: list[Import]) -> None:
    present = {(imp.importer, imp.imported) for imp, _ in check(tree_imports)}
    gone = sorted(KNOWN_VIOLATIONS - present)
    assert not gone, f"fixed: remove these pairs from KNOWN_VIOLATIONS: {gone}"


def test_kernels_import_nothing_from_workbench(tree_imports: list[Import]) -> None:
    bad = [
        f"{imp.importer}:{imp.line} -> {imp.imported}"
        for imp in tree_imports
        if imp.importer.split(".")[0] == "kernels" and imp.imported.split(".")[0] == "workbench"
    ]
    assert not bad, bad


def test_no_import_cycles(tree_imports: list[Import]) -> None:
    found = {tuple(c) for c in cycles(tree_imports)}
    new = sorted(found - set(KNOWN_CYCLES))
    assert not new, f"import cycles (break them with a leaf module or a selector): {new}"
    gone = sorted(set(KNOWN_CYCLES) - found)
    assert not gone, f"fixed: remove these from KNOWN_CYCLES: {gone}"


# --------------------------------------------------------------------------- the checker itself


def _plant(tmp_path: Path, files: dict[str, str]) -> list[Import]:
    for rel, src in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return scan(tmp_path)


def test_planted_upward_import_is_reported(tmp_path: Path) -> None:
    imports = _plant(tmp_path, {
        "workbench/__init__.py": "",
        "workbench/sample/__init__.py": "",
        "workbench/sample/sampler.py": """
            def sample():
                from workbench.engine.llm_engine import LLMEngine  # lazy, still counted
                return LLMEngine
        """,
        "workbench/engine/__init__.py": "",
        "workbench/engine/llm_engine.py": "from workbench.core import request\n",
        "workbench/core/__init__.py": "",
        "workbench/core/request.py": "import torch\n",
        "workbench/core/scheduler.py": "from workbench.worker.model_runner import ModelRunner\n",
        "workbench/worker/__init__.py": "",
        "workbench/worker/model_runner.py": "from workbench.core.request import Request\n",
        "kernels/__init__.py": "",
        "kernels/ref.py": "from workbench.sample.sampler import sample\n",
    })
    found = {(i.importer, i.imported): why for i, why in check(imports)}
    assert found == {
        ("workbench.sample.sampler", "workbench.engine.llm_engine"):
            "model imports engine, which sits above it",
        ("workbench.core.scheduler", "workbench.worker.model_runner"):
            "core imports worker, which sits above it",
        ("kernels.ref", "workbench.sample.sampler"): "kernels imports model, which sits above it",
    }


def test_unplaced_module_has_no_layer() -> None:
    assert layer_of("workbench") == "engine"  # the package root, by its exact rule
    assert layer_of("workbench.newpackage.thing") is None  # not covered by the root's rule
    assert layer_of("workbench.worker.model_runner") == "worker"  # longest rule wins
    assert layer_of("workbench.core.request") == "core"
    assert layer_of("workbench.distributed.kv_transfer.metadata") == "core"  # longest rule
    assert layer_of("workbench.errors") == "leaf"


def test_planted_leaf_importing_a_layer_is_reported() -> None:
    src = "from workbench.engine.llm_engine import LLMEngine\n"
    imports = imports_of("workbench.errors", src, False, {"workbench.engine.llm_engine"})
    assert check(imports) == [
        (Import("workbench.errors", "workbench.engine.llm_engine", 1),
         "shared leaf imports the engine layer"),
    ]


def test_planted_cycle_is_found(tmp_path: Path) -> None:
    imports = _plant(tmp_path, {
        "workbench/__init__.py": "",
        "workbench/attention/__init__.py": "",
        "workbench/attention/backends.py": "from .torch_backend import TorchBackend\n",
        "workbench/attention/torch_backend.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from workbench.attention.backends import AttentionBackend
        """,
    })
    assert cycles(imports) == [
        ["workbench.attention.backends", "workbench.attention.torch_backend"],
    ]


def test_from_package_import_submodule_resolves_to_the_submodule() -> None:
    src = "from workbench import profiling, LLM\nfrom . import cpu_gemm\n"
    known = {"workbench.profiling", "workbench.layers.cpu_gemm"}
    got = {i.imported for i in imports_of("workbench.layers.linear", src, False, known)}
    assert got == {"workbench.profiling", "workbench", "workbench.layers.cpu_gemm"}
