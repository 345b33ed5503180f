"""Whether two credentials share a prefix cache: the one three-valued outcome of a `kvfence
probe` run and of the gateway's canary rounds.

Invariant: `isolated` is never claimed without a positive control that passed; anything that
cannot be told is `inconclusive`, never a pass.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    ISOLATED = "isolated"
    SHARED = "shared"
    INCONCLUSIVE = "inconclusive"
