"""The one exception the shared state raises, in a module that does not import Redis: the
limiter and the health board catch it whether or not the `redis` extra is installed."""

from __future__ import annotations


class SharedUnavailable(Exception):
    """Redis could not be reached or answered an error; the caller applies `on_failure`."""
