"""Every file a policy load reads besides the policy itself (secrets, key and trust files, digest
files, public prefix files, tokenizers, the tenant registry), whether or not it could be read,
so the reload watcher can follow them all: a digest file created after the policy that names it
is noticed like an edit of the policy.

Invariant: a reader notes a path before it tries to read it; `recording` collects the notes of
one load only (a context variable, so concurrent loads in threads never mix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

_READ: ContextVar[set[Path] | None] = ContextVar("kvfence_policy_sources", default=None)


def note(path: Path) -> None:
    """The load in progress reads (or tries to read) `path`."""
    found = _READ.get()
    if found is not None:
        found.add(path)


@contextlib.contextmanager
def recording() -> Iterator[set[Path]]:
    """Collect the paths noted inside the block."""
    found: set[Path] = set()
    token = _READ.set(found)
    try:
        yield found
    finally:
        _READ.reset(token)
