"""Is a TCP port free to listen on? Checked before a server starts, so a busy port is one
clean line (`workbench serve`, `workbench router`, `workbench ui`) instead of a bind error
after minutes of start-up.

    check_port_free("127.0.0.1", 8000)   # ValueError naming the port and --port when taken
"""

from __future__ import annotations

import errno
import socket


def port_in_use(host: str, port: int) -> bool:
    """Whether a listener holds `host:port` (a bind with SO_REUSEADDR, as uvicorn's, fails
    with EADDRINUSE). Port 0 (any free port) is never in use."""
    if port == 0:
        return False
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # an unknown host: the server's own bind reports it
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def check_port_free(host: str, port: int, what: str = "the server") -> None:
    """ValueError (one line: the port, what to do) when `host:port` is taken."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port ({port!r}) must be an integer in 0..65535")
    if port_in_use(host, port):
        raise ValueError(f"port {port} on {host} is already in use (another server is "
                         f"listening there): stop it, or start {what} on another port with "
                         "--port N")
