"""Public parts in handles: what the gateway signs is what the backend gets, minted as namespaces
of their own; every malformed or contradictory `pub` or `eph` claim is refused."""

from __future__ import annotations

from typing import Any

import pytest

from backend.errors import handle_status
from kvfence.handle import HANDLE_PREFIX, HandleSigner, sign_token
from kvfence.handle_errors import HandleError
from kvfence.public import PUBLIC_GROUP, PublicPart, chat_digest, text_digest
from kvfence.share import Share
from tests.kvfence.test_handle import BODY, KEY, NOW, FakeClock, mint, rid, verifier

PUBLIC = Share(PUBLIC_GROUP, 0.25, 0.1)
SYSTEM = [("system", "You are the support assistant of Example Corp.")]


def part(namespace: str = "pub-1", messages: int = 1, chars: int = 46) -> PublicPart:
    return PublicPart(namespace, messages, chars, chat_digest(SYSTEM), PUBLIC)


def test_digests_separate_roles_contents_and_kinds() -> None:
    assert chat_digest([("system", "ab")]) != chat_digest([("system", "a"), ("b", "")])
    assert chat_digest([("system", "x")]) != chat_digest([("user", "x")])
    assert chat_digest([("user", "x")]) != text_digest("x")
    assert len(text_digest("\ud800 lone surrogates are fine")) == 43


def test_public_parts_travel_and_are_minted_in_their_own_groups() -> None:
    token = mint(public=(part(), part("pub-own", 2, 5)))  # type: ignore[arg-type]
    handle = verifier().verify(token, BODY)
    first, second = handle.public
    assert first.namespace.value == "pub-1" and first.namespace.group == PUBLIC_GROUP
    assert (first.messages, first.chars, first.digest) == (1, 46, chat_digest(SYSTEM))
    assert (first.namespace.ceiling, first.namespace.floor) == (0.25, 0.1)
    assert second.namespace.value == "pub-own" and not handle.namespace.ephemeral


def test_a_request_scoped_handle_is_ephemeral_and_reads_nothing_public() -> None:
    handle = verifier().verify(mint(ephemeral=True), BODY)  # type: ignore[arg-type]
    assert handle.namespace.ephemeral and handle.public == ()
    with pytest.raises(ValueError):
        mint(ephemeral=True, public=(part(),))  # type: ignore[arg-type]


def claims(**extra: Any) -> dict[str, Any]:
    base = {"v": 1, "typ": "handle", "kid": "gw-1", "rid": rid(), "aud": "be-1", "iat": NOW,
            "exp": NOW + 60, "ns": "ns-a", "model": "smollm2", "rev": "r1",
            "bd": "q0mVUCFD6eXBX1PC0bOsOqWLOXF1c8oi6ekkOUVwMEc"}  # fmt: skip
    return {**base, **extra}


GOOD = part().claim()


@pytest.mark.parametrize(
    "extra",
    [
        {"eph": False},
        {"eph": 1},
        {"eph": True, "pub": [GOOD]},
        {"pub": []},
        {"pub": GOOD},
        {"pub": [GOOD] * 5},
        {"pub": [{**GOOD, "ns": "ns-a"}]},  # the request's own namespace
        {"pub": [GOOD, GOOD]},  # not reaching further
        {"pub": [GOOD, {**GOOD, "ns": "pub-2", "m": 0}]},  # chat and completion mixed
        {"pub": [{**GOOD, "c": 0}]},
        {"pub": [{**GOOD, "m": -1}]},
        {"pub": [{**GOOD, "m": True}]},
        {"pub": [{**GOOD, "d": "short"}]},
        {"pub": [{**GOOD, "sh": [0.1, 0.5]}]},  # floor above ceiling
        {"pub": [{**GOOD, "grp": "bad group"}]},
        {"pub": [{**GOOD, "extra": 1}]},
        {"pub": [{k: v for k, v in GOOD.items() if k != "sh"}]},
    ],
)
def test_malformed_public_claims_are_refused(extra: dict[str, Any]) -> None:
    token = sign_token(HANDLE_PREFIX, claims(**extra), KEY)
    with pytest.raises(HandleError) as err:
        verifier().check(token)
    assert err.value.code == "malformed" and handle_status(err.value) == 401


def test_the_signer_refuses_nothing_it_could_not_verify() -> None:
    signer = HandleSigner(KEY, "gw-1", clock=FakeClock())
    token = signer.sign("ns-a", "smollm2", "r1", rid(), "be-1", body=BODY, public=[part()])
    assert verifier().check(token).public == (part(),)
