"""Can the server listen where it was told to? Checked before the model loads, so that a taken
port costs a newcomer one line instead of a model load and a traceback."""
from __future__ import annotations

import errno
import socket

PRIVILEGED_BELOW = 1024


def port_problem(host: str, ports: dict[str, int | None]) -> str | None:
    """Why the server could not listen on `ports` ({flag: port}; None: not wanted) at `host`, in
    one line naming every port at fault and its flag; None when every port is free.

    Each port is bound the way trio's listeners will bind it (every address of `host`,
    SO_REUSEADDR, IPv6 sockets IPv6-only), then let go: a port taken while the model loads
    still fails later.
    """
    wanted = {flag: port for flag, port in ports.items() if port is not None}
    duplicate = _duplicate(wanted)
    if duplicate:
        return duplicate
    taken: dict[str, int] = {}
    problems = []
    for flag, port in wanted.items():
        try:
            exc = _bind_error(host, port)
        except socket.gaierror as unknown:
            return f"--host {host}: no such address or host name ({unknown.strerror})"
        if exc is None:
            continue
        if exc.errno == errno.EADDRINUSE:
            taken[flag] = port
        elif exc.errno == errno.EADDRNOTAVAIL:  # the host's fault, the same for every port
            return explain(exc, host, port, flag)
        else:
            problems.append(explain(exc, host, port, flag))
    return "; ".join(([in_use(host, taken)] if taken else []) + problems) or None


def _bind_error(host: str, port: int) -> OSError | None:
    """What binding `port` on each address of `host` raised first; None when every bind passed."""
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                               flags=socket.AI_PASSIVE):
        try:
            _bind(family, kind, proto, address)
        except OSError as exc:
            if exc.errno != errno.EAFNOSUPPORT:  # e.g. IPv6 switched off: trio skips it too
                return exc
    return None


def in_use(host: str, taken: dict[str, int]) -> str:
    """The ports ({flag: port}) another program holds, all in one message."""
    if len(taken) == 1:
        ((flag, port),) = taken.items()
        return (f"port {port} on {host} is already in use by another program: "
                f"pick another with {flag} PORT (0: any free port)")
    ports, flags = [str(port) for port in taken.values()], list(taken)
    return (f"ports {', '.join(ports[:-1])} and {ports[-1]} on {host} are already in use by another program: "
            f"pick others with {', '.join(flags[:-1])} and {flags[-1]} (0: any free port)")


def explain(exc: OSError, host: str, port: int, flag: str) -> str:
    """A failed bind as a user can act on it."""
    if exc.errno == errno.EADDRINUSE:
        return in_use(host, {flag: port})
    if exc.errno == errno.EACCES and 0 < port < PRIVILEGED_BELOW:
        return (f"port {port} needs root privileges (ports below {PRIVILEGED_BELOW} do): "
                f"pick one above {PRIVILEGED_BELOW - 1} with {flag} PORT")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"--host {host} is not an address of this machine: use 127.0.0.1 (this machine only), "
                "0.0.0.0 (every interface) or one of its own addresses")
    return f"cannot listen on {host} port {port} ({flag}): {exc.strerror or exc}"


def _duplicate(ports: dict[str, int]) -> str | None:
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port and port in seen:
            return f"{seen[port]} and {flag} both name port {port}: each needs its own"
        seen[port] = flag
    return None


def _bind(family: int, kind: int, proto: int, address: tuple) -> None:
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
