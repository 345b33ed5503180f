"""An upstream failure named in the words an operator acts on: refused, timed out, reset, not
found. Used by the 502/504 log line and by the background health checks.

Invariant: the text names the failure and never carries a request's body or headers.
"""

from __future__ import annotations

import errno
import socket

import aiohttp

from gateway.relay.client import ConnectFailed, MalformedAnswer

_ERRNO = {
    errno.ECONNREFUSED: "connection refused (nothing listens there: is the backend running?)",
    errno.ECONNRESET: "connection reset by the backend",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "connect timed out",
    errno.EPIPE: "connection closed by the backend while sending",
}


def _os_error(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return "host name not found"
    known = _ERRNO.get(exc.errno or 0)
    return known or (exc.strerror or type(exc).__name__).lower()


def describe(exc: BaseException) -> str:
    """What went wrong with an upstream call, in a few words."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed by the backend before it answered"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timed out (timeouts.connect_s)"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectFailed):
        return _os_error(exc.os_error)
    if isinstance(exc, MalformedAnswer):
        return str(exc)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "answer cut short (the body's framing broke)"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"malformed answer ({exc.message})"
    if isinstance(exc, OSError):
        return _os_error(exc)
    return type(exc).__name__
