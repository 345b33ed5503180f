import base64
import hashlib
import hmac
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvfence.namespace import SALT_RE, NamespaceKey, derive_namespace

KEY = NamespaceKey("ns1", b"k" * 32)

VECTORS = [
    (
        KEY,
        ("acme", "tenant", "", "smollm2", "1"),
        "ns1.U-5c9URgYFNAi1z1lg5j6BOSCruLWENTDlTd9KZgcak",
    ),
    (
        KEY,
        ("acme", "user", "alice", "smollm2", "1"),
        "ns1.aKQjtiUjBWxad_8ESLHn1l1I9sdXDxT2IHcP3BoKv68",
    ),
    (
        KEY,
        ("acme", "session", "s-42", "smollm2", "1"),
        "ns1.SDNLlD-cy2P1IWaNOXvzTWv76nIroSWJgnvsrUVhNnM",
    ),
    (
        NamespaceKey("ns2", bytes(range(32))),
        ("globex", "tenant", "", "llama-3.1-8b", "2025-01"),
        "ns2.NDHZaFyL358lLLtNV0wM1hu_bjJm_GNEqNKr_5mxuDA",
    ),
]


@pytest.mark.parametrize(("key", "fields", "expected"), VECTORS)
def test_fixed_vectors(key: NamespaceKey, fields: tuple[str, ...], expected: str) -> None:
    assert derive_namespace(key, *fields) == expected


def test_construction_is_length_prefixed_hmac_sha256() -> None:
    parts = ["kvfence/namespace/v1", "acme", "user", "alice", "smollm2", "1"]
    msg = b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in parts)
    mac = hmac.new(b"k" * 32, msg, hashlib.sha256).digest()
    expected = "ns1." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    assert derive_namespace(KEY, "acme", "user", "alice", "smollm2", "1") == expected


def test_stable_across_processes() -> None:
    code = (
        "from kvfence.namespace import *;"
        "print(derive_namespace(NamespaceKey('ns1', b'k'*32),'acme','tenant','','smollm2','1'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == VECTORS[0][2]


BASE = ("acme", "user", "alice", "smollm2", "1")


@pytest.mark.parametrize(
    "changed",
    [
        ("globex", "user", "alice", "smollm2", "1"),
        ("acme", "session", "alice", "smollm2", "1"),
        ("acme", "user", "bob", "smollm2", "1"),
        ("acme", "user", "alice", "other", "1"),
        ("acme", "user", "alice", "smollm2", "2"),
    ],
)
def test_each_field_changes_the_namespace(changed: tuple[str, ...]) -> None:
    assert derive_namespace(KEY, *changed) != derive_namespace(KEY, *BASE)


def test_key_id_and_secret_change_the_namespace() -> None:
    other_id = NamespaceKey("ns2", b"k" * 32)
    other_secret = NamespaceKey("ns1", b"j" * 32)
    base = derive_namespace(KEY, *BASE)
    assert derive_namespace(other_id, *BASE) != base
    assert derive_namespace(other_secret, *BASE).split(".")[1] != base.split(".")[1]


def test_field_boundaries_cannot_be_shifted() -> None:
    a = derive_namespace(KEY, "ab", "user", "c", "m", "1")
    b = derive_namespace(KEY, "a", "user", "bc", "m", "1")
    assert a != b


def test_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="scope"):
        derive_namespace(KEY, "acme", "team", "", "m", "1")
    with pytest.raises(ValueError, match="no scope value"):
        derive_namespace(KEY, "acme", "tenant", "x", "m", "1")
    with pytest.raises(ValueError, match="32 bytes"):
        NamespaceKey("ns1", b"short")
    with pytest.raises(ValueError, match="key id"):
        NamespaceKey("ns/1", b"k" * 32)


text = st.text(min_size=1, max_size=40)


@given(tenant=text, value=text, model=text)
def test_salt_always_fits_vllm_rules(tenant: str, value: str, model: str) -> None:
    salt = derive_namespace(KEY, tenant, "user", value, model, "1")
    assert SALT_RE.fullmatch(salt)
    assert len(salt) <= 128 and not set(salt) & set("/@\\\0")


@given(a=text, b=text, va=st.text(max_size=20), vb=st.text(max_size=20))
def test_two_tenants_never_share_a_namespace(a: str, b: str, va: str, vb: str) -> None:
    if a == b:
        return
    scope_a, scope_b = ("user" if va else "tenant"), ("user" if vb else "tenant")
    assert derive_namespace(KEY, a, scope_a, va, "m", "1") != derive_namespace(
        KEY, b, scope_b, vb, "m", "1"
    )
