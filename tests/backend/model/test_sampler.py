"""The sampler: temperature 0 is argmax; a seed makes a draw depend only on (seed, position) and
the row's logits; top-p keeps the smallest head of the distribution; each row of a batch is
sampled by its own parameters. Torch on the CPU; every draw is seeded, so nothing is flaky."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from backend.engine.plan import SamplingParams
from backend.model import sampler
from backend.model.sampler import sample, seeded_generator
from tests.kit.device_reads import DeviceReads

CPU = torch.device("cpu")
V = 1000


def gen(seed: int = 0) -> torch.Generator:
    g = torch.Generator(device=CPU)
    g.manual_seed(seed)
    return g


def flat_logits(rows: int = 1, vocab: int = V) -> torch.Tensor:
    """logits: [rows, vocab], all equal: every token as likely as any other."""
    return torch.zeros(rows, vocab)


def logits_of(probs: list[float]) -> torch.Tensor:
    """logits: [1, len(probs)] whose softmax is `probs`."""
    return torch.tensor([[math.log(p) for p in probs]])


def seeded(seed: int, temperature: float = 1.0, top_p: float = 1.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_p=top_p, seed=seed)


def draw_one(logits: torch.Tensor, p: SamplingParams, position: int = 0) -> int:
    """logits: [V] -> the token `p` draws for one row at `position`."""
    (token,) = sample(logits.unsqueeze(0), [p], [position], gen(12345))
    return token


def test_temperature_zero_picks_the_argmax_of_every_row() -> None:
    logits = torch.randn(5, 64, generator=gen(1))
    params = [SamplingParams(temperature=0.0)] * 5
    tokens = sample(logits, params, [0] * 5, gen(2))
    assert tokens == logits.argmax(dim=-1).tolist()
    # The generator plays no part: another one gives the same answer.
    assert sample(logits, params, [3] * 5, gen(99)) == tokens
    assert all(isinstance(t, int) for t in tokens)


def test_temperature_zero_ignores_seed_and_top_p() -> None:
    logits = torch.randn(1, 64, generator=gen(3))
    best = int(logits.argmax())
    for seed in range(5):
        assert draw_one(logits[0], SamplingParams(temperature=0.0, top_p=0.1, seed=seed)) == best


def test_a_seeded_draw_repeats_for_the_same_seed_and_position() -> None:
    logits = torch.randn(V, generator=gen(4))
    for position in range(5):
        first = sample(logits.unsqueeze(0), [seeded(7)], [position], gen(0))
        # A different unseeded generator, in a different state, changes nothing.
        other = gen(1)
        torch.rand(10, generator=other)
        assert sample(logits.unsqueeze(0), [seeded(7)], [position], other) == first


def test_different_seeds_give_different_draws() -> None:
    logits = flat_logits()[0]
    for a, b in [(0, 1), (1, 2), (7, 8), (100, 101)]:
        run_a = [draw_one(logits, seeded(a), pos) for pos in range(8)]
        run_b = [draw_one(logits, seeded(b), pos) for pos in range(8)]
        assert run_a != run_b
    first_tokens = {draw_one(logits, seeded(s)) for s in range(20)}
    assert len(first_tokens) > 10  # 20 seeds over 1000 equally likely tokens


def test_a_seeded_draw_changes_with_the_position() -> None:
    logits = flat_logits()[0]
    tokens = [draw_one(logits, seeded(7), pos) for pos in range(20)]
    assert len(set(tokens)) > 10  # not the same token at every step


def test_seeded_generators_are_keyed_by_seed_and_position() -> None:
    def first_value(seed: int, pos: int) -> float:
        return float(torch.rand(1, generator=seeded_generator(seed, pos, CPU)))

    assert first_value(3, 4) == first_value(3, 4)
    assert first_value(3, 4) != first_value(3, 5)
    assert first_value(3, 4) != first_value(4, 4)
    # "seed:position" must not collide across the two numbers.
    assert first_value(1, 23) != first_value(12, 3)


def test_a_seeded_row_draws_the_same_token_alone_or_in_any_batch() -> None:
    row = torch.randn(V, generator=gen(5))
    alone = draw_one(row, seeded(11), position=6)
    others = torch.randn(3, V, generator=gen(6))
    batch = torch.stack([others[0], others[1], row, others[2]])
    params = [seeded(1), SamplingParams(), seeded(11), SamplingParams(temperature=0.0)]
    for unseeded in (gen(0), gen(1)):
        tokens = sample(batch, params, [0, 0, 6, 0], unseeded)
        assert tokens[2] == alone


def test_unseeded_rows_follow_the_given_generator() -> None:
    logits = flat_logits(3)
    params = [SamplingParams()] * 3
    assert sample(logits, params, [0] * 3, gen(5)) == sample(logits, params, [0] * 3, gen(5))
    runs = {tuple(sample(logits, params, [0] * 3, gen(s))) for s in range(5)}
    assert len(runs) > 1


def test_a_small_top_p_keeps_only_the_top_token() -> None:
    logits = logits_of([0.1, 0.5, 0.3, 0.1])[0]
    for top_p in (1e-6, 0.1, 0.5):  # 0.5: the top token alone already reaches it
        tokens = {draw_one(logits, seeded(s, top_p=top_p)) for s in range(100)}
        assert tokens == {1}


def test_top_p_keeps_the_smallest_head_that_reaches_it() -> None:
    logits = logits_of([0.2, 0.5, 0.3])[0]
    tokens = Counter(draw_one(logits, seeded(s, top_p=0.6)) for s in range(400))
    # 0.5 < 0.6 <= 0.5 + 0.3: tokens 1 and 2 are kept, token 0 never drawn.
    assert set(tokens) == {1, 2}
    # Renormalised over the head: about 5/8 and 3/8.
    assert abs(tokens[1] / 400 - 5 / 8) < 0.08


def test_a_top_p_of_one_can_draw_any_token() -> None:
    logits = logits_of([0.2, 0.5, 0.3])[0]
    tokens = {draw_one(logits, seeded(s, top_p=1.0)) for s in range(200)}
    assert tokens == {0, 1, 2}


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_the_softmax_at_the_temperature(temperature: float) -> None:
    probs = [0.5, 0.3, 0.2]
    # softmax(log p / T) is p ** (1 / T), normalised: T < 1 sharpens, T > 1 flattens.
    scaled = [q ** (1 / temperature) for q in probs]
    expected = [q / sum(scaled) for q in scaled]
    logits = logits_of(probs)[0]
    n = 3000
    counts = Counter(draw_one(logits, seeded(s, temperature=temperature)) for s in range(n))
    for token, p in enumerate(expected):
        assert abs(counts[token] / n - p) < 0.04, (token, counts)


def test_each_row_of_a_batch_is_sampled_by_its_own_params() -> None:
    vocab = 8
    base = logits_of([0.30, 0.25, 0.15, 0.10, 0.08, 0.05, 0.04, 0.03])[0]
    # Each row has a different argmax so a row sampled by another row's rule would show.
    rows = torch.stack([base.roll(k) for k in range(4)])  # row k's top token is k
    params = [
        SamplingParams(temperature=0.0),  # greedy
        seeded(0, top_p=0.1),  # only its top token
        seeded(0),  # the full distribution
        SamplingParams(temperature=1.0),  # unseeded, the full distribution
    ]
    seen: list[set[int]] = [set(), set(), set(), set()]
    for step in range(300):
        params[1] = seeded(step, top_p=0.1)
        params[2] = seeded(step)
        tokens = sample(rows, params, [step] * 4, gen(step))
        assert len(tokens) == 4 and all(0 <= t < vocab for t in tokens)
        for i, t in enumerate(tokens):
            seen[i].add(t)
        # The seeded rows draw exactly what they draw alone.
        assert tokens[1] == draw_one(rows[1], params[1], step)
        assert tokens[2] == draw_one(rows[2], params[2], step)
    assert seen[0] == {0}
    assert seen[1] == {1}
    assert seen[2] == set(range(vocab))
    assert seen[3] == set(range(vocab))


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (2.0, 0.9)])
def test_unseeded_rows_drawn_together_follow_the_softmax_and_the_top_p(
    temperature: float, top_p: float
) -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    scaled = [q ** (1 / temperature) for q in probs]
    expected = [q / sum(scaled) for q in scaled]
    head, mass = [], 0.0  # the smallest head that reaches top_p, renormalised
    for token, p in enumerate(expected):
        if mass >= top_p:
            break
        head.append(token)
        mass += p
    n = 4000  # one batch of n equal rows, one draw
    params = [SamplingParams(temperature=temperature, top_p=top_p)] * n
    tokens = sample(logits_of(probs).expand(n, -1), params, [0] * n, gen(21))
    counts = Counter(tokens)
    assert set(counts) == set(head)
    for token in head:
        assert abs(counts[token] / n - expected[token] / mass) < 0.04, (token, counts)


def test_a_mixed_batch_reads_nothing_back_until_its_tokens() -> None:
    """No row reads a scalar back on its own (on a GPU, each would wait for the device): the
    step's tokens come back once, all together."""
    logits = torch.randn(6, 64, generator=gen(8))
    params = [SamplingParams(temperature=0.0), seeded(1, top_p=0.5), seeded(2),
              SamplingParams(temperature=0.8, top_p=0.5), SamplingParams(),
              seeded(3, 0.7, 0.9)]  # fmt: skip
    with DeviceReads() as reads:
        tokens = sample(logits, params, [4] * 6, gen(9))
    assert not reads.seen
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[1] == draw_one(logits[1], params[1], 4)
    assert tokens[5] == draw_one(logits[5], params[5], 4)


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 1e-7])
def test_a_temperature_too_small_to_divide_by_draws_the_argmax(temperature: float) -> None:
    logits = torch.randn(4, 64, generator=gen(10)) * 20
    params = [
        SamplingParams(temperature=temperature),
        SamplingParams(temperature=temperature, top_p=0.5),
        seeded(5, temperature),
        seeded(6, temperature, 0.3),
    ]
    assert sample(logits, params, [0] * 4, gen(11)) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("uniform", [0.0, 0.5, 1.0])
def test_a_token_of_no_weight_is_never_drawn_whatever_the_uniform(
    uniform: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draw finds one uniform per row in the row's running sum: at either end of its range
    (1.0 stands for a product that rounds up to the total) it still lands on a token with mass."""
    weights = torch.tensor(
        [[0.0, 0.0, 0.25, 0.0, 0.75, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    )
    monkeypatch.setattr(
        torch, "rand", lambda shape, **kw: torch.full(shape, uniform, dtype=kw.get("dtype"))
    )
    drawn = sampler._categorical(weights, gen(0)).tolist()
    assert drawn == [2 if uniform < 0.25 else 4, 1]


def test_a_batch_of_rows_draws_each_row_from_its_own_distribution() -> None:
    """Unseeded rows share one draw: each row still follows its own softmax."""
    probs = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    logits = torch.tensor([[math.log(p) for p in row] for row in probs])
    g = gen(8)
    counts: list[Counter[int]] = [Counter(), Counter()]
    for _ in range(2000):
        for i, t in enumerate(sample(logits, [SamplingParams()] * 2, [0, 0], g)):
            counts[i][t] += 1
    for i, row in enumerate(probs):
        for token, p in enumerate(row):
            assert abs(counts[i][token] / 2000 - p) < 0.04, (i, token)
