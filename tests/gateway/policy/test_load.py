"""Policy validation: every error names file, line and key path; the CLI reports them."""

import textwrap
from pathlib import Path

import pytest

from gateway.policy.backend_model import AuditMode
from gateway.policy.load import load_policy, parse_policy
from gateway.policy.node import PolicyError
from kvfence.cli import main as kvfence_main
from kvfence.keys.keyfile import add_to_trust_file, generate_key, write_private_key
from tests.kit.gateway import ENV, digest, policy_text

URL = "http://127.0.0.1:9"


def errors_of(text: str, base: Path | None = None) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml", env=ENV, base=base)
    return info.value.errors


def test_example_shape_loads() -> None:
    policy = parse_policy(policy_text(URL), "policy.yaml", env=ENV)
    assert [t.id for t in policy.tenants] == ["acme", "globex", "initech", "umbrella"]
    assert policy.gateway.active_key.id == "ns1"
    assert policy.gateway.active_key.secret.value == ENV["NS_KEY"].encode()
    assert ENV["NS_KEY"] not in repr(policy)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "scope: user,",
            "scope: team,",
            ":23: tenants[2].scope: must be one of tenant, user, session",
        ),
        (
            "client_inputs: strip",
            "client_inputs: drop",
            ":9: gateway.client_inputs: must be one of",
        ),
        ("version: 1", "version: 2", ":1: version: must be 1"),
        (
            "{env: PEPPER}",
            "{env: MISSING}",
            ":8: gateway.api_key_pepper: environment variable MISSING",
        ),
        (
            "{env: PEPPER}",
            "hunter2hunter2hunter2",
            ":8: gateway.api_key_pepper: must be {env: NAME} (an environment variable) or "
            "{file: PATH} (a file, relative to the policy's folder); secrets are never written",
        ),
        (
            "access_log: false",
            "access_log: false\n  colour: blue",
            ":13: gateway.colour: unknown key",
        ),
        (
            "[smollm2, other]",
            "[smollm2, nope]",
            "tenants[1].models[1]: no backend serves model nope",
        ),
        ("id: globex", "id: acme", "tenants[1]: duplicate tenant id acme"),
        (
            "backends:\n",
            "backends:\n  - {name: fake-vllm, kind: vllm, url: http://127.0.0.1:9, "
            "models: [{name: third, revision: '1'}]}\n",
            "backends[1]: duplicate backend name fake-vllm",
        ),
        ("kind: vllm", "kind: tgi", "backends[0].kind: kind tgi cannot scope its prefix cache"),
        ("kind: vllm", "kind: nginx", "backends[0].kind: must be one of vllm"),
        ("active: true}", "active: false}", "gateway.namespace_keys: exactly one"),
        ("port: 0", "port: 70000", "gateway.listen.port: must be between 0 and 65535"),
    ],
)
def test_errors_name_line_and_path(old: str, new: str, expected: str) -> None:
    text = policy_text(URL)
    assert old in text
    errors = errors_of(text.replace(old, new, 1))
    assert any(expected in e for e in errors), errors
    assert all(e.startswith("policy.yaml:") for e in errors)


def test_duplicate_key_digest() -> None:
    text = policy_text(URL).replace(digest("globex"), digest("acme"))
    assert any("duplicate API key digest" in e for e in errors_of(text))


def test_several_errors_reported_at_once() -> None:
    text = policy_text(URL).replace("version: 1", "version: 3").replace("scope: user,", "scope: x,")
    assert len(errors_of(text)) == 2


def test_unscoped_backend_needs_allow_unscoped() -> None:
    text = policy_text(URL).replace("kind: vllm", "kind: llamacpp\n    allow_unscoped: true")
    text = text.replace("verify: {canary: false}", "")
    policy = parse_policy(text, "policy.yaml", env=ENV)
    assert policy.backends[0].allow_unscoped


KVFENCE_BACKEND = """\
  - name: own
    kind: kvfence
    url: http://127.0.0.1:9100
    audience: backend-1
    audit: monitor
    attestation_keys: {file: trust.pem}
    models: [{name: tiny, revision: "3"}]
"""


def test_kvfence_backend_fields(tmp_path: Path) -> None:
    handle_key, backend_key = generate_key(), generate_key()
    write_private_key(tmp_path / "h.pem", handle_key)
    add_to_trust_file(tmp_path / "trust.pem", "be", backend_key.public_key())
    text = policy_text(URL).replace("tenants:\n", KVFENCE_BACKEND + "tenants:\n")
    text = text.replace(
        "  api_key_pepper:", "  handle_key: {id: h1, private_key: {file: h.pem}}\n  api_key_pepper:"
    )
    policy = parse_policy(text, "policy.yaml", env=ENV, base=tmp_path)
    own = policy.backends[1]
    assert own.kvfence is not None and own.kvfence.audience == "backend-1"
    assert own.audit is AuditMode.MONITOR
    assert str(own.kvfence.attestation_keys) == "{file: trust.pem}"
    assert policy.gateway.handle_key is not None and policy.gateway.handle_key.id == "h1"
    missing = text.replace("    audience: backend-1\n", "")
    assert any("kind kvfence needs audience" in e for e in errors_of(missing, tmp_path))
    no_file = text.replace("{file: h.pem}", "{file: absent.pem}")
    assert any("handle_key" in e for e in errors_of(no_file, tmp_path))
    wrong = policy_text(URL).replace("kind: vllm", "kind: vllm\n    audience: x")
    assert any("only a backend of kind kvfence" in e for e in errors_of(wrong))


def test_file_secrets_are_relative_to_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ns.key").write_text("s" * 40 + "\n")
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    text = policy_text(URL).replace("{env: NS_KEY}", "{file: ns.key}")
    (tmp_path / "p.yaml").write_text(text)
    assert load_policy(tmp_path / "p.yaml").gateway.active_key.secret.value == b"s" * 40


def test_policy_check_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    good = tmp_path / "good.yaml"
    good.write_text(policy_text(URL))
    assert kvfence_main(["policy", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "ok: 4 tenants, 1 backends" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_text(URL).replace("scope: user,", "scope: team,"))
    assert kvfence_main(["policy", "check", str(bad)]) == 1
    assert (
        f"{bad}:23: tenants[2].scope: must be one of tenant, user, session"
        in capsys.readouterr().err
    )


def test_invalid_yaml(tmp_path: Path) -> None:
    errors = errors_of(textwrap.dedent("version: 1\ngateway: [\n"))
    assert errors[0].startswith("policy.yaml:")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "version: 1\ngateway:\n  namespace_keys: [{id: ns1, active: true}\n  listen: {}\n",
            "policy.yaml:4:3: not valid YAML: expected ',' or ']', but got '<scalar>' "
            "(while parsing a flow sequence that starts at line 3, column 19)",
        ),
        (
            "version: 1\ngateway:\n\tlisten: {}\n",
            "policy.yaml:3:1: not valid YAML: found character '\\t' that cannot start any token "
            "(YAML indents with spaces, never tabs)",
        ),
        ("version: 1\n foo: 2\n", "policy.yaml:2:5: not valid YAML: mapping values are not"),
    ],
)
def test_invalid_yaml_names_the_parsers_reason_line_and_column(text: str, expected: str) -> None:
    errors = errors_of(text)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_a_broken_backend_does_not_add_no_backend_serves_model(tmp_path: Path) -> None:
    """Only the backend's own error: its models are not reported unserved as well."""
    text = policy_text(URL).replace("url: " + URL, "url: " + URL + "\n    api_key: {env: NOPE}")
    errors = errors_of(text)
    assert len(errors) == 1, errors
    assert "backends[0].api_key: environment variable NOPE is not set" in errors[0]
    text = policy_text(URL).replace("[smollm2, other]", "[smollm2, nope]")
    assert any("no backend serves model nope" in e for e in errors_of(text))


@pytest.mark.parametrize("place", ["namespace_keys", "pepper", "handle_key"])
def test_an_inline_secret_is_told_the_accepted_forms(place: str, tmp_path: Path) -> None:
    text = policy_text(URL)
    if place == "namespace_keys":
        text = text.replace("{env: NS_KEY}", '"s3cret-s3cret-s3cret-s3cret-s3cret"')
    elif place == "pepper":
        text = text.replace("{env: PEPPER}", "hunter2hunter2hunter2")
    else:
        text = text.replace(
            "  api_key_pepper:", "  handle_key: {id: h, private_key: PEM}\n  api_key_pepper:"
        )
    errors = errors_of(text, tmp_path)
    assert len(errors) == 1, errors
    assert "secrets are never written inline" in errors[0] or "read from a file" in errors[0]
    assert "{file: PATH}" in errors[0] and "relative to the policy's folder" in errors[0]


def test_a_missing_audit_folder_is_refused_at_policy_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "audit.key").write_text("k" * 32)
    audit = "access_log: false\n  audit_log: {path: audit/audit.jsonl, key: {file: audit.key}}"
    (tmp_path / "p.yaml").write_text(policy_text(URL).replace("access_log: false", audit))
    assert kvfence_main(["policy", "check", str(tmp_path / "p.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"folder {tmp_path / 'audit'} does not exist: create it (mkdir -m 700)" in err
