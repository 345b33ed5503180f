"""The interpreter's cyclic collector in a server process: held off while the process loads what
it keeps for its whole life (imports, the policy, the model), then that set frozen out of every
later collection, so a full collection walks only what requests made since.

Invariant: the collector runs again from the moment the process is ready to serve; what is
frozen is only what was still reachable then (one collection runs first), so no garbage is kept
for life.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """No collection while the body loads; the collector is as it was when the body ends (a
    command that stops before it serves leaves nothing switched off)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def loaded() -> None:
    """Ready to serve: collect what loading left, freeze what lives on, collect from now on."""
    gc.collect()
    gc.freeze()
    gc.enable()


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Around forking workers: what the parent loaded is frozen, with no collection first (one
    would free holes in the pages the workers share, and their own objects would then be
    written there, copying those pages); the few cycles loading left stay, once. A worker
    loads with the collector still off and calls `loaded`; the parent collects again after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.enable()
