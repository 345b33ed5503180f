"""Weighted rendezvous hashing: the same ranking everywhere, minimal movement when a backend
leaves or joins, and shares that follow the weights."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from gateway.routing.rendezvous import rank, score

NAMESPACES = [f"ns-{i:05d}" for i in range(4000)]


@dataclass(frozen=True)
class B:
    name: str
    weight: float = 1.0


def owners(backends: list[B]) -> dict[str, str]:
    return {ns: rank(ns, backends)[0].name for ns in NAMESPACES}


def test_the_ranking_is_stable_and_independent_of_list_order() -> None:
    a, b, c = B("a"), B("b"), B("c")
    for ns in NAMESPACES[:200]:
        assert rank(ns, [a, b, c]) == rank(ns, [c, a, b]) == rank(ns, [b, c, a])
    assert score("ns", "a", 1.0) == score("ns", "a", 1.0)


def test_losing_a_backend_moves_only_its_namespaces() -> None:
    fleet = [B("a"), B("b"), B("c")]
    before = owners(fleet)
    after = owners([b for b in fleet if b.name != "b"])
    moved = {ns for ns in NAMESPACES if before[ns] != after[ns]}
    assert moved == {ns for ns in NAMESPACES if before[ns] == "b"}
    assert 0.25 < len(moved) / len(NAMESPACES) < 0.42  # about a third


def test_adding_a_backend_takes_namespaces_only_onto_itself() -> None:
    before = owners([B("a"), B("b")])
    after = owners([B("a"), B("b"), B("c")])
    moved = [ns for ns in NAMESPACES if before[ns] != after[ns]]
    assert moved and all(after[ns] == "c" for ns in moved)


def test_namespaces_spread_evenly_at_equal_weights() -> None:
    counts = Counter(owners([B("a"), B("b")]).values())
    assert abs(counts["a"] - counts["b"]) < 0.08 * len(NAMESPACES)


@pytest.mark.parametrize("weights", [(1.0, 3.0), (2.0, 1.0, 1.0)])
def test_shares_follow_the_weights(weights: tuple[float, ...]) -> None:
    fleet = [B(f"b{i}", w) for i, w in enumerate(weights)]
    counts = Counter(owners(fleet).values())
    for backend in fleet:
        expected = backend.weight / sum(weights)
        assert abs(counts[backend.name] / len(NAMESPACES) - expected) < 0.04


def test_changing_one_weight_moves_namespaces_only_towards_or_away_from_it() -> None:
    before = owners([B("a"), B("b"), B("c")])
    after = owners([B("a", 2.0), B("b"), B("c")])
    moved = [ns for ns in NAMESPACES if before[ns] != after[ns]]
    assert moved and all(after[ns] == "a" for ns in moved)
