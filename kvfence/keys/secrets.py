"""Reading a secret from an environment variable or a file, the one way every command and the
policy loader do it.

Invariant: a file's secret is its bytes without the trailing line break; an env secret is the
variable's UTF-8 bytes; a missing or empty secret is an error, never an empty key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class SecretError(ValueError):
    """The secret could not be read."""


def from_env(name: str, env: Mapping[str, str] | None = None) -> bytes:
    value = (os.environ if env is None else env).get(name, "")
    if not value:
        raise SecretError(f"environment variable {name} is not set")
    return value.encode("utf-8")


def from_file(path: Path) -> bytes:
    try:
        value = path.read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from exc
    if not value:
        raise SecretError(f"secret file {path} is empty")
    return value
