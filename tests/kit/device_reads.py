"""Counts what torch code reads back from its device on its own: a scalar taken out of a tensor
(`.item()`, `int(t)`, indexing by a 0-d tensor, `if t:`), or an op whose result's size depends
on the data (`nonzero`). On a GPU each one waits for every kernel queued before it; on the CPU
they run the same ops, so a test here catches them before a GPU does. Under
`torch.inference_mode` torch reads some of them without passing here: count under `no_grad`."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}


class DeviceReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """`with DeviceReads() as reads: ...`; then `reads.seen`: each read-back op, counted."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _READS:
            self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))
