"""Probe prompts are fresh, and the attacker's variant shares exactly the prefix it claims."""

from __future__ import annotations

import random

import pytest

from kvfence.probe.prompts import PromptFactory


def test_fresh_prompts_carry_their_own_marker_and_length() -> None:
    factory = PromptFactory(300)
    prompts = [factory.fresh() for _ in range(50)]
    assert len({p.marker for p in prompts}) == 50
    assert all(p.size == 300 and p.text.startswith(p.marker + " ") for p in prompts)
    assert all(len(p.text.split()) == 301 for p in prompts)  # one word per letter + the marker


def test_variant_shares_the_prefix_then_differs_at_once() -> None:
    factory = PromptFactory(40, random.Random(1))
    for shared in (0, 1, 16, 39):
        victim = factory.fresh()
        variant = factory.sharing(victim, shared)
        assert variant.marker == victim.marker and variant.size == victim.size
        assert variant.letters[:shared] == victim.letters[:shared]
        assert variant.letters[shared] != victim.letters[shared]


def test_sharing_everything_repeats_the_victim_and_more_is_refused() -> None:
    factory = PromptFactory(10, random.Random(1))
    victim = factory.fresh()
    assert factory.sharing(victim, 10) == victim
    with pytest.raises(ValueError, match="cannot share"):
        factory.sharing(victim, 11)
