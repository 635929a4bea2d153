"""A server under test started and stopped by the bench: one process group per run.

Place in the flow: an experiment template may name a server `command` (`workbench serve ...`,
`vllm serve ...`); for each variant the engine config becomes server flags
(`server_command_for`), `ServerProcess` starts it in its own session (setsid), waits until
`/health` answers, and on exit stops the whole process group (SIGTERM, then SIGKILL after
`stop_timeout_s`), children included, so no engine process outlives its run. `make_target`
builds the matching target and lifecycle for one variant.

    with ServerProcess(["vllm", "serve", "M", "--port", "8123"], "http://127.0.0.1:8123/v1"):
        result = run(OpenAITarget("http://127.0.0.1:8123/v1", "M"), workload, arrival)

A process killed with SIGKILL cannot clean up after itself; everything else (an exception,
Ctrl-C, interpreter exit via atexit) stops the group.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from workbench.harness.prom import root_url
from workbench.harness.redact import redact, redact_argv, redact_text, secret_values

logger = logging.getLogger(__name__)


class ServerProcess:
    """Start `command`, wait for `base_url`'s /health, stop its process group on exit."""

    def __init__(
        self, command: list[str] | str, base_url: str, ready_timeout_s: float = 600.0,
        env: dict[str, str] | None = None, log_path: str | Path | None = None,
        health_path: str = "/health", stop_timeout_s: float = 15.0,
    ) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else [
            str(c) for c in command]
        if not self.command:
            raise ValueError("ServerProcess command is empty, e.g. ['workbench', 'serve', ...]")
        if not ready_timeout_s > 0:
            raise ValueError(f"ready_timeout_s ({ready_timeout_s}) must be > 0 seconds")
        self.base_url = base_url
        self.health_url = root_url(base_url) + health_path
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.env = dict(env or {})
        self._log_given = log_path is not None
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.ready_s: float | None = None  # seconds from launch to the first healthy answer
        self.returncode: int | None = None

    # ---------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> ServerProcess:
        """Launch and block until /health answers 200; RuntimeError (with the log tail) if
        the process exits first or `ready_timeout_s` passes. Idempotent while running."""
        if self.alive:
            return self
        if _healthy(self.health_url):
            raise RuntimeError(f"something already answers {self.health_url}: stop it or use "
                               "another port, or the bench would measure the wrong server")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="workbench-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        t_launch = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                self.command, stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **self.env},
            )
        except OSError as e:
            self._close_log()
            raise RuntimeError(f"cannot start server command {self.shown_command}: {e}") from e
        atexit.register(self.stop)
        logger.info("started server pid %d: %s (log %s)", self.proc.pid,
                    self.shown_command, self.log_path)
        try:
            self._wait_ready(t_launch)
        except BaseException:  # not ready, or Ctrl-C while waiting: no orphan either way
            self.stop()
            raise
        return self

    def _wait_ready(self, t_launch: float) -> None:
        assert self.proc is not None
        deadline = t_launch + self.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"server command exited with code {code} before it was "
                                   f"ready: {self.shown_command}\n{self.log_tail()}")
            if _healthy(self.health_url):
                self.ready_s = time.perf_counter() - t_launch
                return
            if time.perf_counter() > deadline:
                raise RuntimeError(f"server not ready at {self.health_url} after "
                                   f"{self.ready_timeout_s} s (stopped it): "
                                   f"{self.shown_command}\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        """Stop the whole process group: SIGTERM, wait, SIGKILL what is left. Idempotent;
        returns the leader's exit code."""
        proc = self.proc
        if proc is None:
            return self.returncode
        atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        procs = _tree(proc.pid)
        _signal_all(pgid, procs, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=self.stop_timeout_s)
        if alive:
            logger.warning("server pid %d ignored SIGTERM for %.0f s: SIGKILL", pgid,
                           self.stop_timeout_s)
        _signal_all(pgid, alive, signal.SIGKILL)  # the group too: members we did not see
        psutil.wait_procs(alive, timeout=5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        self.returncode = proc.returncode
        self.proc = None
        self._close_log()
        return self.returncode

    def restart(self) -> ServerProcess:
        """A fresh server (the bench's "cold" cache state)."""
        self.stop()
        return self.start()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- reporting
    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's output."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_bytes()[-64_000:].decode("utf-8", "replace")
        tail = "\n".join(text.splitlines()[-lines:])
        return redact_text(tail, secret_values(self.command))  # a key the server echoed

    @property
    def shown_command(self) -> str:
        """The command as logged and in errors: secret flags' values redacted (redact.py)."""
        return redact_text(shlex.join(redact_argv(self.command)), secret_values(self.command))

    def describe(self) -> dict[str, Any]:
        return {"command": redact_argv(self.command), "base_url": self.base_url,
                "pid": self.pid, "ready_s": self.ready_s, "log_path": str(self.log_path),
                "env": redact(self.env)}

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    """The leader and every descendant now (children that left the group included)."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(pgid: int, procs: list[psutil.Process], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)


# --------------------------------------------------------------------------- commands
def engine_flags(engine_config: dict[str, Any]) -> list[str]:
    """{"max_num_batched_tokens": 64, "enable_prefix_caching": False} ->
    ["--max-num-batched-tokens", "64", "--no-enable-prefix-caching"] (vLLM's CLI spelling:
    booleans as `--flag` / `--no-flag`, lists as repeated values, dicts as JSON; None is
    left out)."""
    out: list[str] = []
    for key, value in engine_config.items():
        name = str(key).replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, list | tuple):
            out += [f"--{name}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += [f"--{name}", json.dumps(value)]
        else:
            out += [f"--{name}", str(value)]
    return out


def server_command_for(template_target: dict[str, Any], engine_config: dict[str, Any]
                       ) -> list[str]:
    """The template target's `command` (list or string) + the engine config as flags. A flag
    also in `command` appears twice; argparse (vLLM, `workbench serve`) keeps the last."""
    command = template_target.get("command")
    if not command:
        raise ValueError("the target has no 'command' to start a server with, e.g. "
                         "command: [workbench, serve, --model, DIR, --port, '8123']")
    base = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    return base + engine_flags(engine_config)


def make_target(target_spec: dict[str, Any], engine_config: dict[str, Any]
                ) -> tuple[Any, contextlib.AbstractContextManager[Any]]:
    """(Target, lifecycle) for one variant of an experiment template.

    in-process: (InProcessTarget(model, engine_kwargs=engine_config), nullcontext()).
    http: (OpenAITarget(base_url, model, ...), ServerProcess(command + flags) or nullcontext()
    when the spec names no command, i.e. an external server the config cannot change).
    Spec keys for http: base_url, model (served name; "bundled"/a folder match the single
    served model), command, ready_timeout_s, env, log_path, api_key, endpoint, prompt_mode,
    temperature, ignore_eos, poll_interval_s, timeout_s.
    """
    kind = str(target_spec.get("kind", "in-process")).replace("_", "-")
    if kind in ("in-process", "inprocess"):
        from workbench.config.named_models import resolve_model
        from workbench.harness.targets import InProcessTarget

        model = resolve_model(str(target_spec.get("model", "bundled")))
        return InProcessTarget(model, engine_kwargs=dict(engine_config)), contextlib.nullcontext()
    if kind not in ("http", "openai"):
        raise ValueError(f"target kind ({kind!r}) must be 'in-process' or 'http'")
    from workbench.harness.http_target import OpenAITarget

    if "base_url" not in target_spec:
        raise ValueError("an http target needs base_url, e.g. http://127.0.0.1:8123/v1")
    base_url = str(target_spec["base_url"])
    server = None
    if target_spec.get("command"):
        server = ServerProcess(
            server_command_for(target_spec, engine_config), base_url,
            ready_timeout_s=float(target_spec.get("ready_timeout_s", 600.0)),
            env=target_spec.get("env"), log_path=target_spec.get("log_path"),
        )
    elif engine_config:
        logger.warning("http target without a command: the engine config %s is NOT applied "
                       "to the external server at %s", engine_config, base_url)
    keys = ("api_key", "endpoint", "prompt_mode", "temperature", "ignore_eos",
            "poll_interval_s", "timeout_s")
    target = OpenAITarget(base_url, target_spec.get("model"), server=server,
                          engine_config=dict(engine_config),
                          **{k: target_spec[k] for k in keys if k in target_spec})
    return target, (server if server is not None else contextlib.nullcontext())



def run_variant(target_spec: dict[str, Any], engine_config: dict[str, Any], workload: Any,
                arrival: Any, **run_kw: Any) -> tuple[Any, Any]:
    """One measured run of one variant: build the target (`make_target`), start its server,
    `runner.run(...)`, stop the target, then the server. Returns (RunResult, target); the
    target still answers server_series() / server_rows() for `join.log_server_side`."""
    from workbench.harness.replay import run, run_sync

    target, lifecycle = make_target(target_spec, engine_config)
    with lifecycle:
        try:
            result = run(target, workload, arrival, **run_kw)
        finally:
            run_sync(target.stop)
    return result, target
