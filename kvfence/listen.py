"""Whether a server can listen where it is told to, asked before it starts anything (loading a
model, forking workers), so a busy port is one line naming the port and the fix.

Invariant: `check_listen` binds and closes a probe socket; it never keeps a port.
"""

from __future__ import annotations

import errno
import socket


class ListenError(Exception):
    """The address cannot be listened on; the message names it and the fix."""


def check_listen(host: str, port: int, what: str, fix: str) -> None:
    """Raise `ListenError` when nothing could listen at host:port now (port 0: any is fine).
    `what` names the listener ("the gateway"), `fix` the option that moves it."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        raise ListenError(f"cannot listen on {host}: not an address or host name here") from None
    family, kind, proto, _, address = infos[0]
    try:
        with socket.socket(family, kind, proto) as probe:
            # As the servers do: a port left in TIME_WAIT is free, a listening one is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise ListenError(_reason(exc, host, port, what, fix)) from None


def _reason(exc: OSError, host: str, port: int, what: str, fix: str) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where} is already in use, so {what} cannot listen there: stop the process "
            f"that holds it (`ss -ltnp 'sport = :{port}'` names it) or {fix}"
        )
    if exc.errno == errno.EACCES:
        return f"{what} may not listen on {where} (ports below 1024 need privileges): {fix}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine, so {what} cannot listen there"
    return f"{what} cannot listen on {where}: {exc.strerror}"
