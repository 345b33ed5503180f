"""The demo scripts/up runs, in the private state directory .kvfence/: two tenants' API keys
(minted once; each in api-keys/TENANT, for `ACME_KEY=$(cat .kvfence/api-keys/acme)`, and all in
demo.json) and the policy for the ports given (rewritten every run, so each port is named once,
on scripts/up's command line), whose admin listener needs the token scripts/up keeps in
secrets/admin-token (per-tenant metrics and quarantine releases are not for any local process).
`--print` shows how to call the gateway."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvfence.keys.apikey import key_digest, mint_key
from kvfence.keys.keyfile import generate_key, write_private_key

TENANTS = ("acme", "globex")


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def policy(port: int, admin_port: int, backend_port: int) -> str:
    tenants = "".join(
        f"""
  - id: {tenant}
    api_keys: [{{file: tenants/{tenant}.digests}}]
    scope: tenant
    models: [smollm2]"""
        for tenant in TENANTS
    )
    return f"""# Written by scripts/up on every run, for the ports on its command line: change
# those, not this file. Two demo tenants in front of kvfence's own backend; paths are relative
# to this folder (.kvfence/). Field reference: docs/policy.md.
version: 1
gateway:
  listen: {{host: 127.0.0.1, port: {port}}}
  admin: {{host: 127.0.0.1, port: {admin_port}, token: {{file: secrets/admin-token}}}}
  namespace_keys:
    - {{id: ns1, secret: {{file: secrets/namespace-key}}, active: true}}
  api_key_pepper: {{file: secrets/pepper}}
  handle_key: {{id: gateway, private_key: {{file: keys/gateway.key}}}}
  audit_log:
    path: audit/audit.jsonl
    key: {{file: secrets/audit-key}}
    anchor: anchor/audit.anchor   # outside the log's folder: shows a rollback
    fsync: batch
    # The witnessed log (its key signs checkpoints) and a signed receipt per answer:
    # docs/receipts.md. Add a witness's key to `witnesses` to have its cosignatures kept.
    checkpoints: {{name: kvfence.local/log, key: {{file: secrets/log.key}}, interval_s: 1}}
  receipts:
    keys: [{{id: r1, private_key: {{file: secrets/receipt-r1.key}}, active: true}}]
  client_inputs: strip
  timeouts: {{connect_s: 5, first_byte_s: 120, idle_s: 60}}
  access_log: true
backends:
  - name: kvfence-local
    kind: kvfence
    url: http://127.0.0.1:{backend_port}
    audience: kvfence-backend
    attestation_keys: {{file: keys/gateway-trust.json}}
    audit: enforce
    models: [{{name: smollm2, revision: "1"}}]
tenants:{tenants}
"""


def create(state: Path, port: int, admin_port: int, backend_port: int) -> None:
    path = state / "demo.json"
    if path.exists():
        demo = json.loads(path.read_text())
    else:
        pepper = (state / "secrets" / "pepper").read_bytes().rstrip(b"\r\n")
        (state / "tenants").mkdir(mode=0o700, exist_ok=True)
        keys = {tenant: mint_key() for tenant in TENANTS}
        for tenant, key in keys.items():
            (state / "tenants" / f"{tenant}.digests").write_text(key_digest(pepper, key) + "\n")
        demo = {"model": "smollm2", "keys": keys}
    (state / "api-keys").mkdir(mode=0o700, exist_ok=True)
    for tenant, key in demo["keys"].items():
        _private(state / "api-keys" / tenant, key + "\n")
    demo["gateway_url"] = f"http://127.0.0.1:{port}/v1"
    demo["admin_url"] = f"http://127.0.0.1:{admin_port}"
    _private(path, json.dumps(demo, indent=2))
    ensure_receipt_keys(state / "secrets")
    (state / "policy.yaml").write_text(policy(port, admin_port, backend_port))


def show(state: Path) -> None:
    demo = json.loads((state / "demo.json").read_text())
    url, acme = demo["gateway_url"], demo["keys"]["acme"]
    print(f"""
kvfence is up. Gateway: {url}   (admin: {demo["admin_url"]}/status, /metrics, with the token
  in {state / "secrets" / "admin-token"}: .venv/bin/python -m kvfence.cli admin \\
  --url {demo["admin_url"]} --token-file {state / "secrets" / "admin-token"} status)
  tenant acme:   {demo["keys"]["acme"]}
  tenant globex: {demo["keys"]["globex"]}
  (also in {state / "api-keys"}/: ACME_KEY=$(cat .kvfence/api-keys/acme))

Try it:
  curl -sS -i {url}/chat/completions \\
    -H "Authorization: Bearer {acme}" -H "Content-Type: application/json" \\
    -d '{{"model": "smollm2", "max_tokens": 32, "temperature": 0,
         "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  .venv/bin/python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}", api_key="{acme}")
answer = client.chat.completions.create(
    model="smollm2", max_tokens=32, temperature=0,
    messages=[{{"role": "user", "content": "What is the capital of France?"}}])
print(answer.choices[0].message.content)
PY
""")


def ensure_receipt_keys(secrets_dir: Path) -> None:
    """The log's key and the first receipt key, made once (`kvfence keygen` makes the same)."""
    for name in ("log.key", "receipt-r1.key"):
        if not (secrets_dir / name).exists():
            write_private_key(secrets_dir / name, generate_key())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("state", type=Path)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--admin-port", type=int, default=8081)
    parser.add_argument("--backend-port", type=int, default=8100)
    parser.add_argument("--print", action="store_true", dest="show")
    args = parser.parse_args()
    if args.show:
        show(args.state)
    else:
        create(args.state, args.port, args.admin_port, args.backend_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
