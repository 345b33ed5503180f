"""State for scripts/sidecar: secrets, the tenant registry and the policy that puts the gateway in
front of a vLLM, all in .kvfence/sidecar/ (mode 0700). Existing secrets are kept; tenants live
in the registry (the control database, state/control.db), so every run keeps every tenant there,
whoever added it (`kvfence tenants add`, an earlier run's `--tenant`): a run adds the tenants it
is asked for (acme, globex and each `--tenant NAME`) that are missing, each with a key in
keys/NAME, and removes none. The policy is rewritten each run, so the ports given on the command
line are the only ones used, but its namespace keys are the previous policy's: a rotation
(`--rotate-namespace-key`, or an edit of `namespace_keys`) stays. `--block-size` without a
value asks the running vLLM for its KV block size."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gateway.control.offline import OfflineRegistry
from gateway.policy import registry as reg
from kvfence.keys.apikey import TENANT_ID_RE, key_digest, mint_key
from kvfence.keys.keyfile import generate_key, write_private_key

TENANTS = ("acme", "globex")
SECRETS = ("namespace-key", "pepper", "audit-key", "admin-token")
FIRST_KEY: dict[str, Any] = {
    "id": "ns1",
    "secret": {"file": "secrets/namespace-key"},
    "active": True,
}
# The `namespace_keys:` line, and the rest of a block list under it.
_KEYS_RE = re.compile(r"^  namespace_keys:.*\n(?:   .*\n|  - .*\n)*", re.M)
_BLOCK_RE = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M)


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def server_block_size(vllm_url: str) -> int | None:
    """The KV block size a running vLLM reports in its metrics (`vllm:cache_config_info`)."""
    try:
        with urllib.request.urlopen(f"{vllm_url}/metrics", timeout=10) as resp:  # noqa: S310
            found = _BLOCK_RE.search(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return int(found.group(1)) if found else None


def _flow(value: object) -> str:
    """`value` as one line of YAML (flow style, every scalar as JSON)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return json.dumps(value)


def kept_namespace_keys(state: Path) -> list[Any]:
    """The namespace keys of the policy an earlier run wrote (as rotated since), or the first
    key when there is none: never a new key by accident, which would make every cache cold."""
    try:
        doc = yaml.safe_load((state / "policy.yaml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [FIRST_KEY]
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"scripts/sidecar: cannot read {state / 'policy.yaml'}: {exc}") from None
    gateway = doc.get("gateway") if isinstance(doc, dict) else None
    keys = gateway.get("namespace_keys") if isinstance(gateway, dict) else None
    return keys if isinstance(keys, list) and keys else [FIRST_KEY]


def with_namespace_keys(text: str, keys: list[Any]) -> str:
    """A policy's text with its `namespace_keys` (one line, or a block) replaced by `keys`."""
    line = f"  namespace_keys: {_flow(keys)}\n"
    changed, count = _KEYS_RE.subn(lambda _: line, text, count=1)
    if count != 1:
        raise SystemExit("scripts/sidecar: the policy has no gateway.namespace_keys to change")
    return changed


def rotate_namespace_key(state: Path) -> str:
    """A new namespace key, made the active one in the policy; the others stay, inactive (they
    still name the namespaces of older audit records). Returns the new key's id."""
    if not (state / "policy.yaml").exists():
        raise SystemExit("scripts/sidecar: nothing set up yet; run scripts/sidecar")
    keys = kept_namespace_keys(state)
    ids = {str(k.get("id")) for k in keys if isinstance(k, dict)}
    number = len(keys) + 1
    while f"ns{number}" in ids:
        number += 1
    new = f"ns{number}"
    secret = state / "secrets" / f"namespace-key-{new}"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite a key
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32))
    old = [{**k, "active": False} if isinstance(k, dict) else k for k in keys]
    rotated = [*old, {"id": new, "secret": {"file": f"secrets/{secret.name}"}, "active": True}]
    text = (state / "policy.yaml").read_text(encoding="utf-8")
    _replace(state / "policy.yaml", with_namespace_keys(text, rotated))
    return new


def _replace(path: Path, text: str) -> None:
    """Write `path` whole at once: a gateway watching it never reads half a policy."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def policy(
    vllm_url: str,
    model: str,
    port: int,
    admin: int,
    block: int,
    tokenizer: Path | None = None,
    keys: list[Any] | None = None,
) -> str:
    exact = f"tokenizer: {json.dumps(str(tokenizer))}, " if tokenizer else ""
    return f"""# Written by scripts/sidecar on every run: change its options, not this file.
# Tenants and keys are in the control database (state/control.db): kvfence tenants, kvfence keys.
# namespace_keys stays across runs: scripts/sidecar rotate-namespace-key adds an active one.
version: 1
gateway:
  listen: {{host: 127.0.0.1, port: {port}}}
  admin: {{host: 127.0.0.1, port: {admin}, token: {{file: secrets/admin-token}}}}
  state_dir: state
  namespace_keys: {_flow(keys or [FIRST_KEY])}
  api_key_pepper: {{file: secrets/pepper}}
  audit_log:
    path: audit/audit.jsonl
    key: {{file: secrets/audit-key}}
    anchor: anchor/audit.anchor   # outside the log's folder: shows a rollback
    # The witnessed log (its key signs checkpoints) and a signed receipt per answer:
    # docs/receipts.md. Add a witness's key to `witnesses` to have its cosignatures kept.
    checkpoints: {{name: kvfence.local/log, key: {{file: secrets/log.key}}, interval_s: 1}}
  receipts:
    keys: [{{id: r1, private_key: {{file: secrets/receipt-r1.key}}, active: true}}]
backends:
  - name: vllm
    kind: vllm
    url: {vllm_url}
    verify:
      canary: {{interval_s: 300, prompt_tokens: 384}}
      detective: {{{exact}block_size: {block}}}   # the server's KV block size
    models: [{{name: {model}, revision: "1"}}]
registry: true
tenants: []
"""


def _adopt_old_keys(state: Path, doc: reg.Document, pepper: bytes, model: str) -> None:
    """Runs before the registry kept their keys in keys.json: those keys keep working."""
    old = state / "keys.json"
    if not old.exists():
        return
    for tenant, key in json.loads(old.read_text()).items():
        if tenant not in doc["tenants"]:
            record = {"id": tenant, "scope": "tenant", "models": [model],
                      "added_by": "scripts/sidecar"}  # fmt: skip
            reg.add_tenant(doc, record, [])
        digest = key_digest(pepper, key)
        if reg.key_id(digest) not in doc["keys"]:
            reg.new_key(doc, tenant, digest, known=[tenant], label="scripts/sidecar")


def ensure_tenants(state: Path, model: str, wanted: list[str], pepper: bytes) -> list[str]:
    """Every tenant in `wanted` is in the registry with a key in keys/NAME; returns those added.
    Tenants already there (added by anyone) are left as they are."""
    added: list[str] = []
    new_keys: dict[str, str] = {}

    def change(doc: reg.Document) -> None:
        _adopt_old_keys(state, doc, pepper, model)
        for tenant in wanted:
            if tenant in doc["tenants"]:
                continue
            record = {"id": tenant, "scope": "tenant", "models": [model],
                      "added_by": "scripts/sidecar"}  # fmt: skip
            reg.add_tenant(doc, record, [])
            key = mint_key()
            reg.new_key(doc, tenant, key_digest(pepper, key), known=[tenant],
                        label="scripts/sidecar")  # fmt: skip
            new_keys[tenant] = key
            added.append(tenant)

    OfflineRegistry(state_dir=state / "state", pepper=pepper).update(change)
    old = state / "keys.json"
    kept = json.loads(old.read_text()) if old.exists() else {}
    for tenant, key in {**kept, **new_keys}.items():
        if not (state / "keys" / tenant).exists() or tenant in new_keys:
            _private(state / "keys" / tenant, key)
    if old.exists():
        old.unlink()  # its keys are in keys/ and their digests in the registry
    return added


def ensure_receipt_keys(secrets_dir: Path) -> None:
    """The log's key and the first receipt key, made once (`kvfence keygen` makes the same)."""
    for name in ("log.key", "receipt-r1.key"):
        if not (secrets_dir / name).exists():
            write_private_key(secrets_dir / name, generate_key())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("state", type=Path)
    parser.add_argument("--vllm-url")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--port", type=int)
    parser.add_argument("--admin-port", type=int)
    parser.add_argument("--block-size", type=int, help="vLLM's KV block size (default: asked)")
    parser.add_argument(
        "--tokenizer", type=Path, help="the model's Hugging Face folder (exact fingerprints)"
    )
    parser.add_argument("--tenant", action="append", default=[], help="a tenant to keep (repeat)")
    parser.add_argument(
        "--rotate-namespace-key",
        action="store_true",
        help="only this: add a new active namespace key to the policy, keeping the old ones",
    )
    args = parser.parse_args()
    state: Path = args.state
    if args.rotate_namespace_key:
        new = rotate_namespace_key(state)
        print(f"==> namespace key {new} is active ({state / 'secrets' / f'namespace-key-{new}'}); "
              "the older ones stay, inactive, for kvfence audit tenants")  # fmt: skip
        print("==> every namespace changed: each tenant's cache starts cold (a running sidecar "
              "reloads its policy within seconds)")  # fmt: skip
        return 0
    missing = [o for o in ("vllm_url", "port", "admin_port") if getattr(args, o) is None]
    if missing:
        parser.error(f"--{missing[0].replace('_', '-')} is required")
    for bad in (t for t in args.tenant if not TENANT_ID_RE.fullmatch(t)):
        print(f"scripts/sidecar: --tenant {bad!r}: use 1-64 of A-Z a-z 0-9 . _ -", file=sys.stderr)
        return 2
    block = args.block_size or server_block_size(args.vllm_url)
    if block is None:
        block = 16
        print(
            f"scripts/sidecar: {args.vllm_url}/metrics names no KV block size; assuming 16 "
            "(vLLM's GPU default): pass --block-size if yours differs",
            file=sys.stderr,
        )
    for sub in ("", "secrets", "keys", "audit", "anchor", "state", "logs"):
        (state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in SECRETS:
        if not (state / "secrets" / name).exists():
            _private(state / "secrets" / name, secrets.token_urlsafe(32))
    ensure_receipt_keys(state / "secrets")
    pepper = (state / "secrets" / "pepper").read_bytes().rstrip(b"\r\n")
    wanted = list(dict.fromkeys([*TENANTS, *args.tenant]))
    added = ensure_tenants(state, args.model, wanted, pepper)
    keys = kept_namespace_keys(state)
    text = policy(
        args.vllm_url, args.model, args.port, args.admin_port, block, args.tokenizer, keys
    )
    _replace(state / "policy.yaml", text)
    for tenant in added:
        print(f"==> tenant {tenant} added, its key in {state / 'keys' / tenant}")
    print(f"==> the detective audit counts vLLM's KV blocks of {block} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
