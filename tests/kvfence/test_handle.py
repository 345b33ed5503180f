"""Handles: a valid one yields its namespace; every kind of forged, stale or misused one is
refused with the status the backend answers."""

from __future__ import annotations

import base64
import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import handle_status as status
from kvfence.capability import Namespace
from kvfence.handle import HANDLE_PREFIX, HandleSigner, HandleVerifier, sign_token
from kvfence.handle_claims import body_digest
from kvfence.handle_errors import HandleError, HandleForbidden, HandleUnavailable
from kvfence.keys.keyfile import TrustStore, generate_key

NOW = 1_800_000_000.0
KEY = generate_key()
OTHER_KEY = generate_key()
TRUST = TrustStore({"gw-1": KEY.public_key()})
_ids = itertools.count()


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rid() -> str:
    return f"req-{next(_ids)}"


BODY = b'{"model":"smollm2","prompt":"hello"}'


def mint(signer_clock: float = NOW, ttl: float = 60.0, body: bytes = BODY, **over: str) -> str:
    fields = {"namespace": "ns-a", "model": "smollm2", "revision": "r1", "audience": "be-1"}
    fields.update(over)
    request_id = fields.pop("request_id", rid())
    signer = HandleSigner(KEY, "gw-1", clock=FakeClock(signer_clock))
    return signer.sign(request_id=request_id, ttl=ttl, body=body, **fields)


def verifier(clock: FakeClock | None = None, replay_capacity: int = 1000) -> HandleVerifier:
    return HandleVerifier(
        TRUST, "be-1", clock=clock or FakeClock(), replay_capacity=replay_capacity
    )


def refused(v: HandleVerifier, token: str | None, model: str = "smollm2") -> HandleError:
    with pytest.raises(HandleError) as info:
        v.verify(token, BODY).check_model(model)
    return info.value


def test_valid_handle_yields_namespace_and_claims() -> None:
    token = mint(request_id="req-valid")
    assert token.startswith("kvh1.") and "\n" not in token
    handle = verifier().verify(token, BODY)
    assert isinstance(handle.namespace, Namespace)
    assert handle.namespace.value == "ns-a"
    assert (handle.request_id, handle.model, handle.revision) == ("req-valid", "smollm2", "r1")
    assert (handle.key_id, handle.expires_at) == ("gw-1", NOW + 60)


def test_the_handle_binds_the_exact_body_and_a_wrong_one_does_not_spend_it() -> None:
    v = verifier()
    token = mint(body=BODY)
    assert v.check(token).body_digest == body_digest(BODY)
    for other in (b"", BODY + b" ", BODY.replace(b"hello", b"hellO"), b"x" * 10_000):
        with pytest.raises(HandleForbidden) as info:
            v.verify(token, other)
        assert (status(info.value), info.value.code) == (403, "body_mismatch")
    assert v.live_request_ids == 0
    assert v.verify(token, BODY).namespace.value == "ns-a"  # still unspent
    assert refused(v, token).code == "replayed"


def test_only_handles_this_verifier_checked_are_admitted() -> None:
    checked = verifier().check(mint())
    with pytest.raises(HandleError) as info:
        verifier().admit(checked, BODY)
    assert (status(info.value), info.value.code) == (401, "malformed")


@pytest.mark.parametrize("digest", [None, "", "abc", 42, "A" * 44, "+" * 43, "A" * 42 + "="])
def test_a_handle_without_a_valid_body_digest_is_malformed(digest: object) -> None:
    claims = orjson.loads(base64.urlsafe_b64decode(mint().split(".")[1] + "=="))
    if digest is None:
        del claims["bd"]
    else:
        claims["bd"] = digest
    err = refused(verifier(), sign_token(HANDLE_PREFIX, claims, KEY))
    assert (status(err), err.code) == (401, "malformed")


@pytest.mark.parametrize(
    ("token", "code"),
    [
        (None, "missing"),
        ("", "missing"),
        ("garbage", "malformed"),
        ("kvh1..", "malformed"),
        ("kvh1.e30.AAAA", "malformed"),  # {} has no key id
        ("kvh1.!!!.AAAA", "malformed"),
        ("kva1" + "x" * 10, "malformed"),
        ("kvh1." + "A" * 9000 + ".AA", "malformed"),
    ],
)
def test_garbage_and_empty_are_401(token: str | None, code: str) -> None:
    err = refused(verifier(), token)
    assert (status(err), err.code) == (401, code)


def test_forged_with_another_key_is_401() -> None:
    claims = orjson.loads(base64.urlsafe_b64decode(mint().split(".")[1] + "=="))
    forged = sign_token(HANDLE_PREFIX, claims, OTHER_KEY)
    err = refused(verifier(), forged)
    assert (status(err), err.code) == (401, "bad_signature")


def test_unknown_key_id_is_401() -> None:
    token = HandleSigner(OTHER_KEY, "gw-2", clock=FakeClock()).sign(
        "ns-a", "smollm2", "r1", rid(), "be-1", body=BODY
    )
    err = refused(verifier(), token)
    assert (status(err), err.code) == (401, "unknown_key")


def test_expired_is_401_but_clock_skew_is_tolerated() -> None:
    clock = FakeClock(NOW + 64)
    assert verifier(clock).verify(mint(), BODY).namespace.value == "ns-a"
    clock.now = NOW + 66
    err = refused(verifier(clock), mint())
    assert (status(err), err.code) == (401, "expired")


def test_future_dated_is_401() -> None:
    err = refused(verifier(), mint(signer_clock=NOW + 30))
    assert (status(err), err.code) == (401, "not_yet_valid")


def test_overlong_lifetime_is_401() -> None:
    err = refused(verifier(), mint(ttl=3600))
    assert (status(err), err.code) == (401, "bad_lifetime")


def test_wrong_audience_is_403() -> None:
    err = refused(verifier(), mint(audience="be-2"))
    assert isinstance(err, HandleForbidden)
    assert (status(err), err.code) == (403, "wrong_audience")


def test_wrong_model_is_403() -> None:
    err = refused(verifier(), mint(), model="llama-3")
    assert (status(err), err.code) == (403, "wrong_model")


def test_replay_is_401_until_the_handle_expires() -> None:
    clock = FakeClock()
    v = verifier(clock)
    token = mint(request_id="req-once")
    v.verify(token, BODY)
    err = refused(v, token)
    assert (status(err), err.code) == (401, "replayed")
    # another handle for the same request id is a replay too
    assert refused(v, mint(request_id="req-once")).code == "replayed"


def test_replay_store_prunes_expired_entries() -> None:
    clock = FakeClock()
    v = verifier(clock)
    for _ in range(50):
        v.verify(mint(), BODY)
    assert v.live_request_ids == 50
    clock.now = NOW + 200
    v.verify(mint(signer_clock=clock.now), BODY)
    assert v.live_request_ids == 1


def test_full_replay_store_fails_closed_with_503() -> None:
    v = verifier(replay_capacity=2)
    v.verify(mint(), BODY)
    v.verify(mint(), BODY)
    err = refused(v, mint())
    assert isinstance(err, HandleUnavailable)
    assert (status(err), err.code) == (503, "replay_store_full")


def test_truncated_handles_are_401() -> None:
    token = mint()
    v = verifier()
    for cut in range(len(token)):
        assert status(refused(v, token[:cut])) == 401


def flip(token: str, position: int) -> str:
    raw = bytearray(token.encode("ascii"))
    raw[position // 8] ^= 1 << (position % 8)
    return raw.decode("latin-1")


def test_every_single_bit_flip_is_refused() -> None:
    token = mint(request_id="req-bits")
    v = verifier()
    for position in range(len(token) * 8):
        assert status(refused(v, flip(token, position))) == 401
    assert v.verify(token, BODY).request_id == "req-bits"


@settings(max_examples=100, deadline=None)
@given(
    namespace=st.text(min_size=1, max_size=80),
    request_id=st.text(min_size=1, max_size=40),
    where=st.floats(0, 1, exclude_max=True),
)
def test_bit_flips_in_any_handle_are_refused(namespace: str, request_id: str, where: float) -> None:
    token = mint(namespace=namespace, request_id=request_id)
    err = refused(verifier(), flip(token, int(where * len(token) * 8)))
    assert status(err) == 401


def test_admin_handle_verifies_only_as_admin() -> None:
    signer = HandleSigner(KEY, "gw-1", clock=FakeClock())
    admin = signer.sign_admin("flush", "ns-a", rid(), "be-1")
    v = verifier()
    err = refused(v, admin)
    assert (status(err), err.code) == (403, "wrong_scope")
    admin = signer.sign_admin("flush", "ns-a", rid(), "be-1")
    verified = v.verify_admin(admin, "flush")
    assert verified.namespace.value == "ns-a" and verified.action == "flush"


def test_normal_handle_is_not_admin_and_actions_are_bound() -> None:
    signer = HandleSigner(KEY, "gw-1", clock=FakeClock())
    v = verifier()
    with pytest.raises(HandleForbidden) as info:
        v.verify_admin(mint(), "flush")
    assert info.value.code == "wrong_scope"
    with pytest.raises(HandleForbidden) as info:
        v.verify_admin(signer.sign_admin("drop-all", "ns-a", rid(), "be-1"), "flush")
    assert info.value.code == "wrong_action"
    with pytest.raises(HandleError) as err:
        v.verify_admin(None, "flush")
    assert status(err.value) == 401


def test_signer_refuses_empty_fields() -> None:
    signer = HandleSigner(KEY, "gw-1")
    with pytest.raises(ValueError):
        signer.sign("", "smollm2", "r1", rid(), "be-1", body=BODY)
    with pytest.raises(ValueError):
        signer.sign("ns-a", "smollm2", "r1", "", "be-1", body=BODY)
    with pytest.raises(ValueError):
        signer.sign("ns-a", "smollm2", "r1", rid(), "be-1", ttl=0, body=BODY)
