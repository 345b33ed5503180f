"""Attestations: what the backend signs is what the gateway reads; tampering is refused; the
verdict names cross-namespace use."""

from __future__ import annotations

import pytest

from kvfence.attestation import (
    ATTESTATION_PREFIX,
    Attestation,
    AttestationError,
    AttestationSigner,
    AttestationVerifier,
    check_attestation,
)
from kvfence.keys.keyfile import TrustStore, generate_key
from kvfence.token import sign_token
from kvfence.verdict import Verdict

KEY = generate_key()
TRUST = TrustStore({"be-key": KEY.public_key()})
SIGNER = AttestationSigner(KEY, "be-key", "be-1", clock=lambda: 1_800_000_000.0)


def attest(namespaces: list[str], request_id: str = "req-1", namespace: str = "ns-a") -> str:
    return SIGNER.sign(request_id, namespace, 40, 32, namespaces)


def test_round_trip_carries_every_field() -> None:
    token = attest(["ns-a", "ns-a"])
    att = AttestationVerifier(TRUST, backend_id="be-1").verify(token)
    assert token.startswith("kva1.")
    assert (att.backend_id, att.key_id, att.request_id, att.namespace) == (
        "be-1",
        "be-key",
        "req-1",
        "ns-a",
    )
    assert (att.prompt_tokens, att.cached_tokens) == (40, 32)
    assert att.block_namespaces == frozenset({"ns-a"})
    assert att.issued_at == 1_800_000_000.0
    assert len(att.digest) == 64


def test_digest_differs_between_attestations() -> None:
    verifier = AttestationVerifier(TRUST)
    assert verifier.verify(attest(["ns-a"])).digest != verifier.verify(attest([])).digest


def test_tampered_attestation_is_refused() -> None:
    token = attest(["ns-b"])
    head, payload, sig = token.split(".")
    # flip every payload character in turn to a different base64url character
    for i in range(len(payload)):
        swapped = "A" if payload[i] != "A" else "B"
        tampered = f"{head}.{payload[:i]}{swapped}{payload[i + 1 :]}.{sig}"
        with pytest.raises(AttestationError) as info:
            AttestationVerifier(TRUST).verify(tampered)
        assert info.value.code in {"malformed", "unknown_key", "bad_signature"}


@pytest.mark.parametrize("token", [None, "", "kva1.x.y", "kvh1.e30.AA", "nonsense"])
def test_missing_or_garbage_is_refused(token: str | None) -> None:
    with pytest.raises(AttestationError):
        AttestationVerifier(TRUST).verify(token)


def test_other_key_and_other_backend_are_refused() -> None:
    other = AttestationSigner(generate_key(), "be-key", "be-1")
    with pytest.raises(AttestationError) as info:
        AttestationVerifier(TRUST).verify(other.sign("req-1", "ns-a", 1, 0, []))
    assert info.value.code == "bad_signature"
    with pytest.raises(AttestationError) as info:
        AttestationVerifier(TRUST, backend_id="be-2").verify(attest([]))
    assert info.value.code == "wrong_backend"


def verified(namespaces: list[str], request_id: str = "req-1") -> Attestation:
    return AttestationVerifier(TRUST).verify(attest(namespaces, request_id=request_id))


def test_check_attestation_verdicts() -> None:
    assert check_attestation(verified(["ns-a"]), "req-1", "ns-a") == Verdict.CLEAN
    assert check_attestation(verified([]), "req-1", "ns-a") == "clean"
    assert check_attestation(verified(["ns-a", "ns-b"]), "req-1", "ns-a") == "violation"
    assert check_attestation(verified(["ns-a"], request_id="req-2"), "req-1", "ns-a") == (
        "mismatch"
    )
    assert check_attestation(verified(["ns-a"]), "req-1", "ns-b") == Verdict.MISMATCH


def test_signer_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        SIGNER.sign("req-1", "ns-a", 10, 11, [])


def with_runs(runs: list[tuple[str, int]], namespaces: list[str] | None = None) -> Attestation:
    names = sorted({n for n, _ in runs}) if namespaces is None else namespaces
    token = SIGNER.sign("req-1", "ns-a", 40, 32, names, runs)
    return AttestationVerifier(TRUST).verify(token)


def test_block_runs_say_which_blocks_came_from_which_namespace() -> None:
    att = with_runs([("pub", 2), ("ns-a", 1)])
    assert att.block_runs == (("pub", 2), ("ns-a", 1))
    assert att.block_namespaces == frozenset({"pub", "ns-a"})
    assert verified(["ns-a"]).block_runs == ()  # absent when not sent


def test_public_blocks_pass_only_where_the_policy_allowed_that_namespace() -> None:
    allowed = frozenset({"pub"})
    assert check_attestation(with_runs([("pub", 2), ("ns-a", 1)]), "req-1", "ns-a", allowed) == (
        "clean"
    )
    # the same blocks without the allowance, or another public namespace: a violation
    assert check_attestation(with_runs([("pub", 2), ("ns-a", 1)]), "req-1", "ns-a") == "violation"
    other = with_runs([("pub-2", 2), ("ns-a", 1)])
    assert check_attestation(other, "req-1", "ns-a", allowed) == "violation"
    # public blocks only lead a prompt: one after the request's own is a violation
    late = with_runs([("pub", 1), ("ns-a", 1), ("pub", 1)])
    assert check_attestation(late, "req-1", "ns-a", allowed) == "violation"
    # public blocks the runs do not account for: mismatch
    unaccounted = with_runs([("ns-a", 3)], namespaces=["ns-a", "pub"])
    assert check_attestation(unaccounted, "req-1", "ns-a", allowed) == "mismatch"


@pytest.mark.parametrize("runs", [[["ns-a"]], [["ns-a", 0]], [["ns-a", True]], "x", [[1, 2]]])
def test_malformed_block_runs_are_refused(runs: object) -> None:
    claims = {"v": 1, "typ": "attestation", "kid": "be-key", "bid": "be-1", "rid": "r",
              "ns": "ns-a", "pt": 1, "ct": 0, "bns": ["ns-a"], "iat": 1.0, "blk": runs}  # fmt: skip
    with pytest.raises(AttestationError):
        AttestationVerifier(TRUST).verify(sign_token(ATTESTATION_PREFIX, claims, KEY))
