"""`api_keys` entries that name a file of digests, so a checked-in policy can admit keys minted
on each machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.policy.node import PolicyError
from tests.kit.gateway import ENV, digest, policy_text


def _write(tmp_path: Path, tenants_line: str) -> Path:
    text = policy_text("http://127.0.0.1:9").replace(
        f'- {{id: acme, api_keys: ["{digest("acme")}"], scope: tenant, models: [smollm2]}}',
        tenants_line,
    )
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_a_digest_file_admits_each_listed_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "acme.digests").write_text(f"# acme's keys\n{digest('acme')}\n\n")
    path = _write(tmp_path, "- {id: acme, api_keys: [{file: acme.digests}], scope: tenant, "
                            "models: [smollm2]}")  # fmt: skip
    policy = load_policy(path)
    acme = next(t for t in policy.tenants if t.id == "acme")
    assert acme.api_keys == (digest("acme"),)


def test_a_missing_or_bad_digest_file_is_a_policy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    line = "- {id: acme, api_keys: [{file: acme.digests}], scope: tenant, models: [smollm2]}"
    path = _write(tmp_path, line)
    with pytest.raises(PolicyError) as missing:
        load_policy(path)
    assert "cannot read key digest file acme.digests" in "\n".join(missing.value.errors)
    (tmp_path / "acme.digests").write_text("not-a-digest\n")
    with pytest.raises(PolicyError) as bad:
        load_policy(path)
    assert "tenants[0].api_keys[0]" in "\n".join(bad.value.errors)
