"""Template targets run with this interpreter: a router's command, or a `workbench serve`.

    local_target(spec, port=, num_replicas=, model=)  a copy of a target spec whose command
                                          runs `sys.executable -m workbench.cli` (no
                                          `workbench` script needed on PATH), on another
                                          port / replica count / model
    serve_target(model, port=None)        an http target that starts `workbench serve` of one
                                          model on `port` (None: a free port now)
    free_port()                           a TCP port nothing listens on at the moment

The runner appends the run's engine config to the command as flags (`server_process`), so
the same target serves the baseline and every variant.
"""

from __future__ import annotations

import copy
import socket
import sys
from pathlib import Path
from typing import Any


def _set_flag(command: list[str], flag: str, value: str) -> list[str]:
    if flag in command:
        i = command.index(flag)
        return [*command[: i + 1], value, *command[i + 2:]]
    return [*command, flag, value]


def local_target(spec: dict[str, Any], port: int | None = None,
                 num_replicas: int | None = None, model: str | None = None) -> dict[str, Any]:
    """A copy of an http target spec whose command runs `sys.executable -m workbench.cli`
    (no `workbench` script needed on PATH), with `port`, `num_replicas` and `model` (a named
    model or folder, served under that name) set when given."""
    out = copy.deepcopy(spec)
    command = [str(c) for c in out["command"]]
    if command and Path(command[0]).name == "workbench":
        command = [sys.executable, "-m", "workbench.cli", *command[1:]]
    if port is not None:
        command = _set_flag(command, "--port", str(port))
        out["base_url"] = f"http://127.0.0.1:{port}/v1"
    if num_replicas is not None:
        command = _set_flag(command, "--num-replicas", str(num_replicas))
    if model is not None:
        command = _set_flag(_set_flag(command, "--model", model), "--served-model-name", model)
        out["model"] = out["tokenizer"] = model
    out["command"] = command
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_target(model: str, port: int | None = None) -> dict[str, Any]:
    """An http target that starts `workbench serve --model MODEL` (served as MODEL) on
    `port` for each run, read the way the harness reads any OpenAI server."""
    return local_target({"kind": "http", "command": ["workbench", "serve",
                                                     "--log-level", "warning"],
                         "ready_timeout_s": 300, "poll_interval_s": 0.5},
                        port=free_port() if port is None else port, model=model)
