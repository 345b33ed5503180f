"""Nothing about other tenants: a tenant reads everything it can reach (its receipts, their
proofs, the key set, the log endpoints) window after window while another tenant sends a random
number of requests per window; its best estimate of those counts, from every number it saw, is
no better than guessing (docs/threat-model.md, "Receipts and the witnessed log")."""

from __future__ import annotations

import random
import re
from collections import Counter

import orjson

from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask

WINDOWS = 10
_NUMBER = re.compile(rb"(?<![0-9A-Za-z+/])[0-9]+(?![0-9A-Za-z+/])")


async def observe(stack: Stack, receipt_ids: list[str]) -> list[int]:
    """Every whole number in everything the observer can fetch (bar its own receipts' times and
    ids, which it chose by asking): the quantities a count would leak through."""
    tenant, seen = stack.tenant("acme"), []
    log = "/v1/kvfence/log"
    paths = ["/v1/kvfence/keys", log, f"{log}/checkpoint?old=0", f"{log}/checkpoint?old=1",
             f"{log}?log=kvfence.test/log"]  # fmt: skip
    for rid in receipt_ids:
        paths += [f"/v1/kvfence/receipts/{rid}", f"/v1/kvfence/receipts/{rid}/proof"]
    for path in paths:
        status, body = await tenant.get(path)
        seen.append(status)
        if path.startswith("/v1/kvfence/receipts/") and not path.endswith("/proof"):
            doc = orjson.loads(body)
            doc.pop("served_at")
            body = orjson.dumps(doc)
        body = re.sub(rb"rcpt_[0-9a-f]+_[0-9a-f]+", b"rcpt", body)
        seen += [int(n) for n in _NUMBER.findall(body)]
    return seen


async def test_a_tenant_learns_nothing_of_another_tenants_volume(stack: Stack) -> None:
    rng = random.Random(30)
    counts = [rng.randint(0, 4) for _ in range(WINDOWS)]
    assert len(set(counts)) > 2
    views = []
    for window, count in enumerate(counts):
        for _ in range(count):  # the other tenant's traffic this window
            assert (await ask(stack, "globex", CHAT))[0] == 200
        ids = [(await ask(stack, "acme", CHAT))[3] for _ in range(2)]
        views.append((window, await observe(stack, ids)))
    # The observer's numbers move only with its own traffic: with the other tenant's counts
    # removed from the world, each window's numbers would be the same. Per window, the numbers
    # minus what two answers of its own add are identical, so every estimator built on them
    # gives the same guess for every window.
    firsts = [view for _, view in views]
    shapes = {len(v) for v in firsts}
    assert len(shapes) == 1
    deltas = [tuple(b - a for a, b in zip(firsts[i], firsts[i + 1], strict=True))
              for i in range(WINDOWS - 1)]  # fmt: skip
    assert len(set(deltas)) == 1, "the observer's view changed with the other tenant's traffic"
    # Measured: the best estimator that maps the observer's per-window change to a count is
    # right as often as always guessing the most frequent count, and no more.
    by_view: dict[tuple[int, ...], Counter[int]] = {}
    for delta, count in zip(deltas, counts[1:], strict=True):
        by_view.setdefault(delta, Counter())[count] += 1
    best = sum(c.most_common(1)[0][1] for c in by_view.values())
    guessing = Counter(counts[1:]).most_common(1)[0][1]
    assert best == guessing
