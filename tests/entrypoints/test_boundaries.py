"""The front doors' boundaries, read from the source as tests/test_layers.py reads the layers
(every import counts: module level, lazy, under TYPE_CHECKING).

- The router speaks to its replicas over HTTP only: no module under workbench/router imports
  workbench.server.
- The OpenAI protocol package (workbench/entrypoints/openai/protocol) imports nothing of
  workbench outside itself, so the harness can read it and the engine never enters it.
- The protocol lives once: no module outside it defines a class or function of its public
  names (APIError, the request models, the SSE codec, the detokenizer, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import Import, _plant, all_modules, scan

ROUTER = "workbench.router"
SERVER = "workbench.server"
PROTOCOL = "workbench.entrypoints.openai.protocol"
# what only the protocol package may define
PROTOCOL_NAMES = frozenset({
    "APIError", "CompletionRequest", "ChatCompletionRequest", "parse_request",
    "check_json_values", "encode_event", "SSEByteDecoder", "SSEDecoder", "parse_json",
    "IncrementalDetokenizer", "StopStringChecker", "APIKeyMiddleware",
    "ClosingStreamingResponse", "read_body", "decode_json", "completion_prompts",
    "chat_prompt", "default_chat_template", "usage", "envelope", "completion_choice",
    "chat_choice", "chat_delta_choice", "model_list",
})


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def router_imports_of_server(imports: list[Import]) -> list[str]:
    return [f"{i.importer}:{i.line} -> {i.imported}" for i in imports
            if _inside(i.importer, ROUTER) and _inside(i.imported, SERVER)]


def protocol_imports_outside(imports: list[Import]) -> list[str]:
    return [f"{i.importer}:{i.line} -> {i.imported}" for i in imports
            if _inside(i.importer, PROTOCOL) and not _inside(i.imported, PROTOCOL)]


def protocol_copies(modules: dict[str, Path]) -> list[str]:
    """Top-level classes and functions named like the protocol's, defined outside it."""
    found = []
    for mod, path in modules.items():
        if _inside(mod, PROTOCOL):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and (
                    node.name in PROTOCOL_NAMES):
                found.append(f"{mod}:{node.lineno} defines {node.name}")
    return found


# --------------------------------------------------------------------------- the tree


def test_the_router_imports_nothing_of_the_server() -> None:
    bad = router_imports_of_server(scan())
    assert bad == [], "the router reaches replicas over HTTP only:\n" + "\n".join(bad)


def test_the_protocol_imports_only_itself() -> None:
    bad = protocol_imports_outside(scan())
    assert bad == [], "the protocol package imports only itself:\n" + "\n".join(bad)


def test_the_protocol_is_defined_once() -> None:
    copies = protocol_copies(all_modules())
    assert copies == [], "import these from the protocol package:\n" + "\n".join(copies)


# --------------------------------------------------------------------------- the checks


def test_planted_imports_are_reported(tmp_path: Path) -> None:
    imports = _plant(tmp_path, {
        "workbench/__init__.py": "",
        "workbench/server/__init__.py": "",
        "workbench/server/app.py": "",
        "workbench/router/__init__.py": "",
        "workbench/router/relay.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from workbench.server import app
        """,
        "workbench/router/forward.py": """
            def f():
                import workbench.server.app  # lazy, still counted
        """,
        "workbench/entrypoints/openai/protocol/sse.py": "from workbench.engine import LLM\n",
        "workbench/entrypoints/openai/protocol/errors.py": "",
        "workbench/entrypoints/openai/protocol/http.py":
            "from workbench.entrypoints.openai.protocol.errors import APIError\n",
    })
    assert router_imports_of_server(imports) == [
        "workbench.router.forward:3 -> workbench.server.app",
        "workbench.router.relay:4 -> workbench.server.app",
    ]
    assert protocol_imports_outside(imports) == [
        "workbench.entrypoints.openai.protocol.sse:1 -> workbench.engine",
    ]


def test_a_planted_copy_is_reported(tmp_path: Path) -> None:
    mods = {}
    for name, src in {"workbench.router.relay": "class StopStringChecker:\n    pass\n",
                      "workbench.server.app": "def helper():\n    pass\n",
                      PROTOCOL + ".detokenizer": "class StopStringChecker:\n    pass\n"}.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
        mods[name] = path
    assert protocol_copies(mods) == ["workbench.router.relay:1 defines StopStringChecker"]
