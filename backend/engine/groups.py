"""Capacity groups of the KV pool: one per tenant (all its namespaces), each with a ceiling it
may not exceed and a floor below which other groups may not evict it. Plain bookkeeping.

Invariant: `held` counts every block a group's namespaces own (used or cached); floors are
kept only for groups that hold blocks, and together they never reserve more than half the pool
(they are scaled down), so any group can always reach the other half.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvfence.capability import Namespace


class CapacityGroups:
    def __init__(self, num_blocks: int, max_share: float) -> None:
        if not 0.0 < max_share <= 1.0:
            raise ValueError("max_share must be in (0, 1]")
        self.num_blocks = num_blocks
        self.max_share = max_share  # this backend's cap on any group's ceiling
        self.held: dict[str, int] = {}
        self._floors: dict[str, int] = {}  # in blocks, per group holding blocks

    def ceiling(self, namespace: Namespace) -> int:
        """The most blocks the namespace's group may hold at once."""
        return max(1, int(min(namespace.ceiling, self.max_share) * self.num_blocks))

    def floor(self, group: str) -> int:
        """The group's protected blocks, scaled down when all floors would reserve more than
        half the pool."""
        floor = self._floors.get(group, 0)
        reserved = sum(self._floors.values())
        half = self.num_blocks // 2
        return floor * half // reserved if reserved > half else floor

    def add(self, namespace: Namespace, n: int) -> None:
        group = namespace.group
        self.held[group] = self.held.get(group, 0) + n
        self._floors[group] = min(int(namespace.floor * self.num_blocks), self.ceiling(namespace))

    def remove(self, group: str) -> None:
        left = self.held[group] - 1
        if left:
            self.held[group] = left
        else:
            del self.held[group]
            self._floors.pop(group, None)

    def victims(
        self, group: str, need: int, taken: set[int], idle: Iterable[tuple[int, Namespace]]
    ) -> list[int]:
        """Up to `need` idle blocks (from `idle`, least recently used first) that `group` may
        evict: its own, or another group's while that group stays above its floor."""
        out: list[int] = []
        left = dict(self.held)  # what each group would hold after these evictions
        left[group] = left.get(group, 0) - len(taken)
        for block_id, owner in idle:
            if len(out) == need:
                break
            other = owner.group
            if block_id in taken or (other != group and left[other] <= self.floor(other)):
                continue  # protected: another tenant may not push it below its floor
            out.append(block_id)
            left[other] -= 1
        return out

    def check(self, held: dict[Namespace, int]) -> str | None:
        """What is wrong with the groups given the per-namespace counts, or None."""
        groups: dict[str, int] = {}
        ceilings: dict[str, int] = {}
        for namespace, n in held.items():
            groups[namespace.group] = groups.get(namespace.group, 0) + n
            ceilings[namespace.group] = max(
                ceilings.get(namespace.group, 0), self.ceiling(namespace)
            )
        if groups != self.held:
            return "per-group block counts drifted"
        if any(n > ceilings[g] for g, n in groups.items()):
            return "a group is over its ceiling"
        if set(self._floors) != set(groups):
            return "floors recorded for groups holding nothing"
        if any(self._floors[g] > ceilings[g] for g in groups):
            return "a floor above a ceiling"
        return None
