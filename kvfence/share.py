"""A tenant's capacity in a backend's KV pool, as handles carry it (claims `grp` and `sh`).

Invariant: a `Share` always has a well-formed group and 0 <= floor <= ceiling <= 1, ceiling > 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

GROUP_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class Share:
    """A capacity group in a backend's KV pool: `group` names the tenant without revealing it
    (all its namespaces share one ceiling), `ceiling` is the largest share of the pool it may
    hold, `floor` the share other groups may not evict it below."""

    group: str
    ceiling: float
    floor: float

    def __post_init__(self) -> None:
        if not GROUP_RE.fullmatch(self.group):
            raise ValueError("a capacity group is 1-64 characters of [A-Za-z0-9._-]")
        if not (0.0 <= self.floor <= self.ceiling <= 1.0 and self.ceiling > 0.0):
            raise ValueError("need 0 <= floor <= ceiling <= 1 and ceiling > 0")
