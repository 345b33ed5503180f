"""How many canary rounds tenants' answers may trigger (one worker's count): a tenant triggers
at most one round per backend every `trigger_interval_s`, and triggered rounds together send at
most `max_share` of the tenant requests this worker forwarded to the backend, plus one round's
worth, so the first suspicious answer is always checked and no tenant can turn the canary into
a flood.

Invariant: a refused trigger changes nothing but its count; the limits are per worker (with N
workers, N times the per-tenant rate and the same share of traffic overall).
"""

from __future__ import annotations

from collections import Counter

from gateway.policy.backend_model import CanarySettings
from gateway.verify.timing import most_requests


class TriggerBudget:
    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}
        self._requests: Counter[str] = Counter()
        self._spent: Counter[str] = Counter()

    def request(self, backend: str) -> None:
        """One tenant request forwarded to `backend` (what the share is a share of)."""
        self._requests[backend] += 1

    def take(self, backend: str, tenant: str, canary: CanarySettings, now: float) -> bool:
        """Whether `tenant`'s answer may trigger a round on `backend` now (and note that it
        did)."""
        last = self._last.get((backend, tenant))
        if last is not None and now - last < canary.trigger_interval_s:
            return False
        allowance = canary.max_share * self._requests[backend] + 3 + most_requests(canary)
        if self._spent[backend] >= allowance:
            return False
        self._last[(backend, tenant)] = now
        return True

    def spent(self, backend: str, requests: int) -> None:
        self._spent[backend] += requests
