"""``--insecure`` (plain-text gRPC) only where every address is loopback.

Without TLS, the model updates, the run's configuration and the SuperNodes' messages cross the
network in the clear and anyone on the path can read or alter them; ``--insecure`` is therefore
refused unless every address the command listens on or connects to is a loopback address:
``127.0.0.0/8``, ``::1`` (also IPv4-mapped, ``::ffff:127.0.0.1``) or the name ``localhost``.
Other names are refused even when they resolve to loopback today (a DNS answer can change
after the check). Imports nothing of Flower, so the CLI checks before it starts anything.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["check_insecure", "is_loopback", "split_host"]

#: The allowed addresses, as the error message names them.
LOOPBACK = "127.0.0.0/8, ::1 or localhost"


def split_host(address: str) -> str:
    """The host of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` (a bare IPv6 address
    such as ``::1`` is its own host)."""
    value = address.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.rsplit(":", 1)[0]
    return value


def is_loopback(address: str) -> bool:
    """True when the host of ``address`` (see :func:`split_host`) is a loopback address."""
    host = split_host(address)
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # any other name: refused, whatever it resolves to now
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def check_insecure(addresses: Iterable[tuple[str, str]]) -> None:
    """Raise ``ValueError`` (``--insecure: ...`` naming the option and the address) unless
    every ``(option, address)`` is loopback."""
    for option, address in addresses:
        if not is_loopback(address):
            raise ValueError(
                f"--insecure: refused for {option} {address}, which is not a loopback address "
                f"({LOOPBACK}): without TLS the model updates and the run's messages would "
                "cross the network in the clear; use TLS (--ssl-certfile/--ssl-keyfile on the "
                "SuperLink, --root-certificates on the SuperNodes and flwr) instead"
            )
