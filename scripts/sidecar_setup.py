"""State for scripts/sidecar: secrets, two tenants' API keys and the policy that puts the gateway
in front of a vLLM, all in .kvfence/sidecar/ (mode 0700). Existing secrets and keys are kept; the
policy is rewritten each run, so the ports given on the command line are the only ones used."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from kvfence.apikey import key_digest, mint_key

TENANTS = ("acme", "globex")
SECRETS = ("namespace-key", "pepper", "audit-key", "admin-token")


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def policy(
    vllm_url: str, model: str, port: int, admin: int, block: int, tokenizer: Path | None = None
) -> str:
    exact = f"tokenizer: {json.dumps(str(tokenizer))}, " if tokenizer else ""
    tenants = "".join(
        f"""
  - id: {tenant}
    api_keys: [{{file: tenants/{tenant}.digests}}]
    scope: tenant
    models: [{model}]"""
        for tenant in TENANTS
    )
    return f"""# Written by scripts/sidecar on every run: change its options, not this file.
version: 1
gateway:
  listen: {{host: 127.0.0.1, port: {port}}}
  admin: {{host: 127.0.0.1, port: {admin}, token: {{file: secrets/admin-token}}}}
  state_dir: state
  namespace_keys: [{{id: ns1, secret: {{file: secrets/namespace-key}}, active: true}}]
  api_key_pepper: {{file: secrets/pepper}}
  audit_log:
    path: audit/audit.jsonl
    key: {{file: secrets/audit-key}}
    anchor: anchor/audit.anchor   # outside the log's folder: shows a rollback
backends:
  - name: vllm
    kind: vllm
    url: {vllm_url}
    verify:
      canary: {{interval_s: 300, prompt_tokens: 384}}
      detective: {{{exact}block_size: {block}}}
    models: [{{name: {model}, revision: "1"}}]
tenants:{tenants}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("state", type=Path)
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--admin-port", type=int, required=True)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--tokenizer", type=Path, help="the model's Hugging Face folder (exact fingerprints)"
    )
    args = parser.parse_args()
    state: Path = args.state
    for sub in ("", "secrets", "tenants", "keys", "audit", "anchor", "state", "logs"):
        (state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in SECRETS:
        if not (state / "secrets" / name).exists():
            _private(state / "secrets" / name, secrets.token_urlsafe(32))
    pepper = (state / "secrets" / "pepper").read_bytes().rstrip(b"\r\n")
    keys_path = state / "keys.json"
    keys = json.loads(keys_path.read_text()) if keys_path.exists() else {}
    for tenant in TENANTS:
        keys.setdefault(tenant, mint_key())
        _private(state / "tenants" / f"{tenant}.digests", key_digest(pepper, keys[tenant]) + "\n")
        _private(state / "keys" / tenant, keys[tenant])
    _private(keys_path, json.dumps(keys, indent=2))
    text = policy(
        args.vllm_url, args.model, args.port, args.admin_port, args.block_size, args.tokenizer
    )
    (state / "policy.yaml").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
