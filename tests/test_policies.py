"""The shipped example policies load as documented once their secrets exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from kvfence.apikey import key_digest, mint_key

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "KVFENCE_NS_KEY": "n" * 43,
    "KVFENCE_PEPPER": "p" * 43,
    "KVFENCE_AUDIT_KEY": "a" * 43,
    "KVFENCE_ADMIN_TOKEN": "t" * 43,
}


def test_the_sidecar_policy_loads_with_verification_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copy(ROOT / "policies" / "sidecar-vllm.yaml", policies)
    state = tmp_path / ".kvfence" / "sidecar"
    (state / "audit").mkdir(parents=True)
    for tenant in ("acme", "globex"):
        digest = key_digest(SECRETS["KVFENCE_PEPPER"].encode(), mint_key())
        (state / "tenants").mkdir(exist_ok=True)
        (state / "tenants" / f"{tenant}.digests").write_text(digest + "\n")
    policy = load_policy(policies / "sidecar-vllm.yaml")
    [vllm] = policy.backends
    assert vllm.verify is not None and vllm.verify.canary is not None
    assert vllm.verify.detective is not None and policy.gateway.admin.token is not None
    assert policy.gateway.state_dir == policies / "../.kvfence/sidecar/state"
