"""The detective audit on its own: an honest conversation's hits are explained (its earlier
turns and answers are in the history), another namespace's are not; the history is shared
between processes, bounded, and never claims to reach back past what it evicted."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.backend_model import DetectiveSettings
from gateway.policy.model import HistorySettings
from gateway.verify import fingerprints as fp
from gateway.verify.detective import Detective
from gateway.verify.store import FingerprintStore
from kvfence.verdict import Verdict
from tests.kit.vllm_server import MODEL_DIR

CHAT = "/v1/chat/completions"
BOUND = DetectiveSettings(block_size=16)
SYSTEM = {"role": "system", "content": "You answer questions about shipping. " * 8}


def chat(*turns: str) -> dict[str, Any]:
    roles = ["user", "assistant"]
    messages = [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "messages": messages}


@pytest.fixture
def detective(tmp_path: Path) -> Detective:
    store = FingerprintStore(tmp_path / "history.bin", 1 << 12)
    return Detective(store, b"s" * 32, HistorySettings(block_max_age_s=0))


async def test_an_honest_conversation_is_explained_and_a_foreign_one_is_not(
    detective: Detective,
) -> None:
    first = await detective.record(BOUND, "ns-a", CHAT, chat("What is a pallet?"))
    assert detective.explained(first, None) < 150  # nothing before it: only template overhead
    detective.record_answer(first, "A flat platform for goods.")
    second = await detective.record(
        BOUND, "ns-a", CHAT, chat("What is a pallet?", "A flat platform for goods.", "Sizes?")
    )
    # Everything up to the answer was recorded before: a server may have cached all of it.
    assert detective.explained(second, None) >= len(second.stream) - 40
    assert detective.judge(second, None, 200) is None
    other = await detective.record(BOUND, "ns-b", CHAT, chat("What is a pallet?"))
    assert detective.judge(other, None, 200) is Verdict.VIOLATION  # B's first request hit A's


async def test_a_young_history_says_unexplained_not_violation(tmp_path: Path) -> None:
    store = FingerprintStore(tmp_path / "h.bin", 1 << 12)
    young = Detective(store, b"s" * 32, HistorySettings(block_max_age_s=3600))
    obs = await young.record(BOUND, "ns-b", CHAT, chat("anything at all " * 20))
    assert young.judge(obs, None, 160) is Verdict.UNEXPLAINED
    assert young.judge(obs, None, 0) is None


async def test_exact_mode_explains_whole_blocks_only(tmp_path: Path) -> None:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        if os.environ.get("KVFENCE_REQUIRE_VLLM") == "1":  # scripts/vllm-env made it: required
            pytest.fail(f"KVFENCE_REQUIRE_VLLM=1 but {MODEL_DIR}/tokenizer.json is missing")
        pytest.skip("no tokenizer directory here (made by scripts/vllm-env)")
    store = FingerprintStore(tmp_path / "h.bin", 1 << 12)
    detective = Detective(store, b"s" * 32, HistorySettings(block_max_age_s=0))
    exact = DetectiveSettings(tokenizer=MODEL_DIR, block_size=16)
    body = chat("Tell me about customs forms for pallets to Norway, please.")
    first = await detective.record(exact, "ns-a", CHAT, body)
    assert first.exact is not None
    again = await detective.record(exact, "ns-a", CHAT, body)
    blocks = first.exact.total // 16 * 16
    assert detective.explained(again, first.exact.total) == blocks
    assert detective.judge(again, first.exact.total, blocks) is None
    # A count the tokenizer disagrees with falls back to the (looser, still sound) bound.
    assert detective.explained(again, first.exact.total + 1) >= blocks


def test_the_store_is_shared_and_its_evictions_move_complete_since(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    one, two = FingerprintStore(path, 64), FingerprintStore(path, 64)
    one.add([11, 12])
    two.add([11])
    assert two.counts([11, 12, 13]) == [2, 1, 0]
    start = one.complete_since
    later = time.time() + 100
    one.add([k * 64 + 7 for k in range(1, 40)], now=later)  # one bucket, over-full
    assert one.complete_since > start  # something older than `later` was dropped
    one.close()
    two.close()


def test_bound_keys_depend_on_namespace_and_prefix() -> None:
    stream, _ = fp.prompt_stream(CHAT, chat("hello there " * 10))
    positions = fp.checkpoints(stream)
    a = fp.bound_keys(b"s" * 32, "ns-a", stream, positions)
    b = fp.bound_keys(b"s" * 32, "ns-b", stream, positions)
    assert len(set(a)) == len(a) and not set(a) & set(b)
    assert positions[-1] == len(stream) and positions[:3] == [32, 64, 128]
