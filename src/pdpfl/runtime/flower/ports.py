"""Ports and addresses of the Flower processes, checked before anything starts.

A SuperLink on a taken port used to fail after 30-50 s with only Flower's log lines, and a
SuperNode pointed at an address where nothing listens retried forever: :func:`port_problem` and
:func:`wait_for_listener` let ``pdpfl flower superlink`` / ``supernode`` say what is wrong, naming
the option, before any process starts.
"""

from __future__ import annotations

import errno
import socket
import time

__all__ = ["free_port", "port_problem", "wait_for_listener"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (None: it can, right now).

    Binds a probe socket with ``SO_REUSEADDR`` (as servers do: a port held only by connections
    closing in TIME_WAIT is free) and no ``SO_REUSEPORT``, so that a port another server
    listens on -- even one that set ``SO_REUSEPORT``, as gRPC does -- is reported as taken.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return f"cannot resolve {host!r} ({err.strerror})"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (another SuperLink or server?)"
            if err.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine"
            if err.errno == errno.EACCES:
                return f"port {port} needs privileges on this machine (use a port above 1023)"
            return f"cannot listen on {host}:{port} ({err.strerror or err})"
    return None


def wait_for_listener(host: str, port: int, timeout_s: float, poll_s: float = 0.5) -> str | None:
    """Wait until something accepts TCP connections at ``host:port``; ``None`` once it does,
    else (after ``timeout_s``) why not: the host does not resolve, or nothing listens."""
    deadline = time.monotonic() + float(timeout_s)
    last = "nothing accepted a connection"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(0.1, timeout_s))):
                return None
        except socket.gaierror as err:
            return f"cannot resolve {host!r} ({err.strerror})"
        except OSError as err:
            last = err.strerror or str(err)
        if time.monotonic() + poll_s > deadline:
            return f"nothing accepted a connection within {timeout_s:g} s ({last})"
        time.sleep(poll_s)
