"""`kvfence audit tenants`: the labels in audit records (a record's own namespace and the foreign
ones an answer used) named as tenants, by an operator who holds the policy's namespace keys;
user and session scopes only with the scope value, anything else said to be unknown."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kvfence.cli import main as kvfence_main
from kvfence.namespace import NamespaceKey, derive_namespace, namespace_label
from tests.kit.gateway import ENV, policy_text


def label(tenant: str, scope: str = "tenant", value: str = "", key: str = "ns1") -> str:
    secret = ENV["NS_KEY"] if key == "ns1" else ENV["NS_KEY2"]
    ns = derive_namespace(NamespaceKey(key, secret.encode()), tenant, scope, value, "smollm2", "1")
    return namespace_label(ns)


def test_the_victims_of_a_violation_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text("http://127.0.0.1:9"))
    log = tmp_path / "audit.jsonl"
    entries = [
        {"kind": "header", "seq": 0},
        {"kind": "record", "request_id": "r1", "tenant": "acme", "backend": "b",
         "verdict": "clean", "namespace": label("acme"), "foreign_namespaces": []},
        {"kind": "record", "request_id": "r2", "tenant": "acme", "backend": "b",
         "verdict": "violation", "namespace": label("acme"),
         "foreign_namespaces": [label("globex", key="ns2"), label("initech", "user", "u-7")]},
    ]  # fmt: skip
    log.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    unknown = "f" * 32
    argv = ["audit", "tenants", "--policy", str(policy), "--log", str(log), unknown]
    assert kvfence_main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{unknown}: unknown (another scope value, key or tenant)"
    assert out[1].startswith("audit.jsonl:3: request r2 of tenant acme on b (violation) used")
    assert "tenant globex (model smollm2, scope tenant, namespace key ns2)" in out[1]
    assert f"unknown {label('initech', 'user', 'u-7')}" in out[1]  # its user id not given
    assert out[2:] == ["2 records, 1 naming foreign namespaces", "  affected: globex in 1 records"]

    assert kvfence_main([*argv[:-1], "--scope-value", "u-7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "tenant initech (model smollm2, scope user 'u-7', namespace key ns1)" in out[0]
    assert "  affected: initech in 1 records" in out
