"""The shipped example policies load as documented once their secrets exist."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from kvfence.keys.apikey import key_digest, mint_key

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


def test_the_demo_policy_of_scripts_up_puts_its_admin_listener_behind_a_token(
    tmp_path: Path,
) -> None:
    state = tmp_path / ".kvfence"
    (state / "secrets").mkdir(parents=True)
    (state / "audit").mkdir()
    (state / "anchor").mkdir()
    for name in ("namespace-key", "pepper", "audit-key", "admin-token"):  # as scripts/up does
        (state / "secrets" / name).write_text(name * 4)
    for key, trust in (("gateway", "backend-trust"), ("backend", "gateway-trust")):
        subprocess.run([sys.executable, "-m", "kvfence.cli", "keygen", "--id", key, "--out",
                        str(state / "keys"), "--trust", str(state / "keys" / f"{trust}.json")],
                       check=True, capture_output=True)  # fmt: skip
    demo = [sys.executable, str(ROOT / "scripts" / "demo_setup.py"), str(state)]
    subprocess.run(demo, check=True, env={"PYTHONPATH": str(ROOT)})
    policy = load_policy(state / "policy.yaml")
    token = policy.gateway.admin.token
    assert token is not None and token.value == b"admin-token" * 4
