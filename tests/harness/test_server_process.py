"""ServerProcess: ready detection, whole-group stop (children too), failures with the log tail;
engine configs as server flags; make_target per template target kind."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from workbench.harness.server_process import (
    ServerProcess,
    engine_flags,
    make_target,
    server_command_for,
)

# A server that forks a child (like vLLM's engine core), writes "leader child" pids, serves
# /health, and with "ignore-term" ignores SIGTERM.
SERVER = """\
import http.server, os, signal, subprocess, sys, time
port, pidfile = int(sys.argv[1]), sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(pidfile, "w").write(f"{os.getpid()} {child.pid}")
print("args:", sys.argv[3:], flush=True)
time.sleep(0.3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True  # dead, waiting for its (re)parent to reap it
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "server.py"
    p.write_text(SERVER)
    return p


def test_ready_then_group_stop_leaves_no_orphan(script: Path, tmp_path: Path) -> None:
    port, pidfile = _port(), tmp_path / "pids"
    url = f"http://127.0.0.1:{port}/v1"
    cmd = server_command_for({"command": [sys.executable, str(script), str(port), str(pidfile)]},
                             {"max_num_batched_tokens": 64})
    sp = ServerProcess(cmd, url, ready_timeout_s=20, log_path=tmp_path / "server.log")
    with sp:
        assert sp.alive and sp.ready_s is not None and sp.ready_s >= 0.3
        assert httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200
        leader, child = map(int, pidfile.read_text().split())
        assert psutil.pid_exists(child) and leader == sp.pid
        with pytest.raises(RuntimeError, match="already answers"):
            ServerProcess(cmd, url).start()  # would measure the wrong server
    assert not sp.alive and _gone(leader) and _gone(child)
    assert "'--max-num-batched-tokens', '64'" in (tmp_path / "server.log").read_text()
    assert sp.stop() == sp.returncode  # idempotent


def test_sigterm_ignored_escalates_to_sigkill(script: Path, tmp_path: Path) -> None:
    port, pidfile = _port(), tmp_path / "pids"
    cmd = [sys.executable, str(script), str(port), str(pidfile), "ignore-term"]
    sp = ServerProcess(cmd, f"http://127.0.0.1:{port}", ready_timeout_s=20, stop_timeout_s=0.5)
    sp.start()
    leader, child = map(int, pidfile.read_text().split())
    t = time.monotonic()
    sp.stop()
    assert time.monotonic() - t >= 0.5
    assert _gone(leader) and _gone(child)


def test_failures_raise_with_log_tail(tmp_path: Path) -> None:
    port = _port()
    boom = [sys.executable, "-c", "print('boom: no such model', flush=True); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*boom: no such model"):
        ServerProcess(boom, f"http://127.0.0.1:{port}/v1", ready_timeout_s=20).start()
    pidfile = tmp_path / "pid"
    mute = [sys.executable, "-c",
            "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(60)", str(pidfile)]
    with pytest.raises(RuntimeError, match="not ready"):
        ServerProcess(mute, f"http://127.0.0.1:{port}/v1", ready_timeout_s=1.0).start()
    assert _gone(int(pidfile.read_text()))
    with pytest.raises(RuntimeError, match="cannot start"):
        ServerProcess(["/nonexistent/server"], f"http://127.0.0.1:{port}").start()


def test_engine_config_as_server_flags() -> None:
    cfg = {"max_num_batched_tokens": 64, "enable_prefix_caching": False, "enforce_eager": True,
           "dtype": "float32", "max_model_len": None, "tags": ["a", "b"], "spec": {"k": 1}}
    assert engine_flags(cfg) == [
        "--max-num-batched-tokens", "64", "--no-enable-prefix-caching", "--enforce-eager",
        "--dtype", "float32", "--tags", "a", "b", "--spec", '{"k": 1}']
    base = {"command": "vllm serve M --port 8123"}
    assert server_command_for(base, {"max_num_seqs": 8}) == [
        "vllm", "serve", "M", "--port", "8123", "--max-num-seqs", "8"]
    with pytest.raises(ValueError, match="no 'command'"):
        server_command_for({}, {})


def test_make_target_per_kind() -> None:
    from workbench.harness.http_target import OpenAITarget
    from workbench.harness.targets import InProcessTarget

    t, life = make_target({"kind": "in-process", "model": "/some/dir"}, {"dtype": "float32"})
    assert isinstance(t, InProcessTarget) and isinstance(life, contextlib.nullcontext)
    spec = {"kind": "http", "base_url": "http://127.0.0.1:8123/v1", "model": "m",
            "command": ["workbench", "serve", "--port", "8123"], "endpoint": "chat"}
    t, life = make_target(spec, {"max_num_batched_tokens": 64})
    assert isinstance(t, OpenAITarget) and isinstance(life, ServerProcess)
    assert t.server is life and t.endpoint == "chat" and t.model == "m"
    assert life.command[-2:] == ["--max-num-batched-tokens", "64"]
    assert t.describe()["config"]["max_num_batched_tokens"] == 64
    t, life = make_target({"kind": "http", "base_url": "http://h:1/v1", "model": "m"}, {})
    assert isinstance(life, contextlib.nullcontext) and t.server is None
    with pytest.raises(ValueError, match="base_url"):
        make_target({"kind": "http"}, {})
    with pytest.raises(ValueError, match="kind"):
        make_target({"kind": "grpc"}, {})
