"""Fresh random probe prompts (Gu et al.: letters separated by spaces, about one token each) and
the attacker's variants that share a victim prompt's prefix.

Invariant: every fresh prompt starts with its own random marker, drawn from the operating
system's generator unless a test passes a seeded one, so no cache anywhere can already hold any
of its blocks; a variant shares exactly `shared` letters and its next letter always differs.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

LETTERS = string.ascii_lowercase
MARKER_HEX = 16  # random hex digits; no fixed text a server could use to recognise the probe


@dataclass(frozen=True, slots=True)
class Prompt:
    marker: str
    letters: tuple[str, ...]

    @property
    def text(self) -> str:
        return self.marker + " " + " ".join(self.letters)

    @property
    def size(self) -> int:
        """Letters after the marker (each about one token)."""
        return len(self.letters)

    def estimated_tokens(self) -> int:
        """For servers that report no usage: a letter is about a token, the marker about 8."""
        return self.size + 8


class PromptFactory:
    """Makes prompts of `size` letters. The probe's prompts must be unpredictable, so the
    default generator is the OS's; simulations pass a seeded `random.Random`."""

    def __init__(self, size: int, rng: random.Random | None = None) -> None:
        if size < 2:
            raise ValueError("a probe prompt needs at least 2 letters")
        self.size = size
        self._rng = rng if rng is not None else random.SystemRandom()

    def _letters(self, count: int) -> tuple[str, ...]:
        return tuple(self._rng.choice(LETTERS) for _ in range(count))

    def fresh(self) -> Prompt:
        marker = "".join(self._rng.choice("0123456789abcdef") for _ in range(MARKER_HEX))
        return Prompt(marker, self._letters(self.size))

    def sharing(self, victim: Prompt, shared: int) -> Prompt:
        """Victim's marker and first `shared` letters, then a forced different letter, then
        random letters to the victim's length (`shared` == size repeats the victim exactly)."""
        if not 0 <= shared <= victim.size:
            raise ValueError(f"cannot share {shared} of {victim.size} letters")
        if shared == victim.size:
            return victim
        head = victim.letters[:shared]
        differing = self._rng.choice(LETTERS.replace(victim.letters[shared], ""))
        tail = self._letters(victim.size - shared - 1)
        return Prompt(victim.marker, (*head, differing, *tail))
