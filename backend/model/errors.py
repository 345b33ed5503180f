"""Errors raised while resolving and loading a model.

Invariant: every failure to open, parse or accept a model file surfaces as ModelLoadError with a
message naming the path and the reason, never as a raw library traceback.
"""

from __future__ import annotations


class ModelLoadError(Exception):
    """The model could not be loaded: wrong path, corrupt or truncated file, or an unsupported
    architecture. The message is meant for the person starting the server."""
