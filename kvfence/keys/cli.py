"""`kvfence keys new|list|revoke|expire`: a tenant's API keys; `kvfence keys fingerprint`: the
fingerprint of a gateway's receipt key set, the trust root its operator publishes.

With a policy that has a tenant registry (`registry: true`), keys are the registry's: `new`
mints one (an id, a label, an expiry, budgets), `list` shows them, `revoke` and `expire` end
them, through the running gateway's admin listener or offline against the registry file
(`gateway.registry.cli`, imported only then). Without one, `new` mints a key for a policy's
`api_keys`: the pepper comes from an environment variable, a file, or the policy's
`api_key_pepper`; with `--policy` the tenant must be one the policy names; `--digest-file`
appends the digest to the file of digests the tenant's `api_keys` reads. `--key-file` writes the
key to a new file (mode 0600) instead of printing it, never overwriting.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import yaml

from kvfence.keys.apikey import MIN_PEPPER_BYTES, TENANT_ID_RE, key_digest, mint_key
from kvfence.keys.secrets import SecretError, from_env, from_file


class KeysError(Exception):
    """The key cannot be minted as asked: one line naming the cause and the fix."""


_REGISTRY_ONLY = ("url", "token_file", "token_env", "offline", "label", "expires", "budget")


def _target_options(parser: argparse.ArgumentParser, policy: bool = True) -> None:
    """Where a registry change goes (the same options as `kvfence tenants`)."""
    if policy:
        parser.add_argument("--policy", metavar="FILE", help="the gateway's policy")
        parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--url", help="a gateway's admin listener (default: the policy's)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, help="admin token file (default: the policy's)")
    token.add_argument("--token-env", help="env var holding the admin token")
    parser.add_argument(
        "--offline", action="store_true", help="change the registry file directly, not a gateway"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    new = sub.add_parser("new", help="mint a key for a tenant")
    new.add_argument("--tenant", required=True, help="tenant id ([A-Za-z0-9._-], 1-64)")
    new.add_argument("--json", action="store_true", help="print one JSON object")
    new.add_argument("--label", help="registry: what the key is for (shown by list)")
    new.add_argument("--expires", metavar="WHEN", help="registry: 30d, 12h, 90m, or epoch seconds")
    new.add_argument("--budget", action="append", default=[], metavar="PERIOD=TOKENS",
                     help="registry: this key's tokens per hour, day or month")  # fmt: skip
    _target_options(new, policy=False)
    new.add_argument(
        "--digest-file",
        metavar="PATH",
        type=Path,
        help="append the digest to this file (a tenant's api_keys: [{file: PATH}])",
    )
    new.add_argument(
        "--key-file",
        metavar="PATH",
        type=Path,
        help="write the key to this new file (mode 0600) instead of printing it",
    )
    src = new.add_mutually_exclusive_group()
    src.add_argument("--pepper-env", metavar="NAME", help="env variable (default KVFENCE_PEPPER)")
    src.add_argument("--pepper-file", metavar="PATH", help="file holding the pepper")
    src.add_argument(
        "--policy",
        metavar="FILE",
        help="the policy: its registry (if it has one), else its pepper and tenants",
    )
    fp = sub.add_parser("fingerprint", help="the receipt key set's fingerprint, to publish")
    fp.add_argument("source", help="the key set (GET /v1/kvfence/keys, a file) or the log key")
    listing = sub.add_parser("list", help="a registry's keys (ids, labels, states; never keys)")
    listing.add_argument("--tenant", help="only this tenant's")
    _target_options(listing)
    for name, text in (("revoke", "refuse a key from now on"), ("expire", "set a key's expiry")):
        action = sub.add_parser(name, help=text)
        action.add_argument("key", help="the key's id (kvfence keys list), or a unique prefix")
        if name == "expire":
            action.add_argument("--at", default="now", help="now (default), 30d, or epoch seconds")
        _target_options(action)


def _secret(read: Callable[[], bytes]) -> bytes:
    try:
        return read()
    except SecretError as exc:
        raise KeysError(str(exc)) from exc


def _read_policy(path: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeysError(f"cannot read policy {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KeysError(f"{path} is not valid YAML: run `kvfence policy check {path}`") from exc
    if not isinstance(doc, dict):
        raise KeysError(f"{path} is not a policy: run `kvfence policy check {path}`")
    return doc


def _pepper_from(doc: dict[str, Any], path: str) -> bytes:
    gateway = doc.get("gateway")
    ref = gateway.get("api_key_pepper") if isinstance(gateway, dict) else None
    if isinstance(ref, dict) and set(ref) == {"env"}:
        return _secret(lambda: from_env(str(ref["env"])))
    if isinstance(ref, dict) and set(ref) == {"file"}:
        # As in the policy itself, a file is relative to the policy's folder.
        return _secret(lambda: from_file(Path(path).parent / str(ref["file"])))
    raise KeysError(f"{path}: gateway.api_key_pepper must be {{env: NAME}} or {{file: PATH}}")


def _check_tenant_in(doc: dict[str, Any], path: str, tenant: str) -> None:
    tenants = doc.get("tenants")
    ids = [t.get("id") for t in tenants if isinstance(t, dict)] if isinstance(tenants, list) else []
    if tenant not in ids:
        known = ", ".join(str(i) for i in ids) or "none"
        raise KeysError(
            f"tenant {tenant!r} is not in {path} (its tenants: {known}): add it to the "
            "policy's tenants first, or check the spelling"
        )


def read_pepper(args: argparse.Namespace) -> bytes:
    if args.pepper_file:
        pepper = _secret(lambda: from_file(Path(args.pepper_file)))
    elif args.policy:
        doc = _read_policy(args.policy)
        _check_tenant_in(doc, args.policy, args.tenant)
        pepper = _pepper_from(doc, args.policy)
    else:
        pepper = _secret(lambda: from_env(args.pepper_env or "KVFENCE_PEPPER"))
    if len(pepper) < MIN_PEPPER_BYTES:
        raise KeysError(f"the pepper must be at least {MIN_PEPPER_BYTES} bytes")
    return pepper


def _append_digest(path: Path, digest: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="ascii") as out:
            out.write(digest + "\n")
    except OSError as exc:
        raise KeysError(f"cannot append to {path}: {exc.strerror}") from exc


def _create_key_file(path: Path) -> int:
    """A new file only the caller can read; an existing one is never replaced (it may hold the
    only copy of a key a tenant uses)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise KeysError(f"{path} already exists: remove it first or name a new file") from exc
    except OSError as exc:
        raise KeysError(f"cannot create {path}: {exc.strerror}") from exc


def _write_key(fd: int, key: str, path: Path) -> None:
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key + "\n")
    except OSError as exc:
        raise KeysError(f"cannot write {path}: {exc.strerror}") from exc


def _mint(args: argparse.Namespace, pepper: bytes) -> tuple[str, str]:
    """The key and its digest, recorded where the options say. A failure leaves no key file
    whose digest was not recorded, and no digest of a key that was not kept."""
    fd = None if args.key_file is None else _create_key_file(args.key_file)
    key = mint_key()
    digest = key_digest(pepper, key)
    try:
        if fd is not None:
            _write_key(fd, key, args.key_file)
        if args.digest_file is not None:
            _append_digest(args.digest_file, digest)
    except KeysError:
        if args.key_file is not None:
            args.key_file.unlink(missing_ok=True)
        raise
    return key, digest


def _registry_mode(args: argparse.Namespace) -> bool:
    """Whether `keys new` goes to the tenant registry (else: a digest for the policy file)."""
    wants = [n for n in _REGISTRY_ONLY if getattr(args, n, None) not in (None, False, [])]
    legacy = args.digest_file is not None or args.pepper_env or args.pepper_file
    if wants and legacy:
        option = "--" + wants[0].replace("_", "-")
        raise KeysError(f"{option} is for a tenant registry; --digest-file and --pepper-* are not")
    if wants:
        return True
    if legacy or not args.policy:
        return False
    return "registry" in _read_policy(args.policy)


def _fingerprint(source: str) -> int:
    from kvfence.receipts.note import NoteError, Verifier
    from kvfence.receipts.receipt import KeySet, ReceiptError, fingerprint

    try:
        if os.path.exists(source):
            with open(source, "rb") as fh:
                log_key = KeySet.parse(orjson.loads(fh.read(1 << 20))).log
        else:
            log_key = Verifier.parse(source)
    except (OSError, ValueError, NoteError, ReceiptError) as exc:
        print(f"kvfence keys: {source}: {exc}", file=sys.stderr)
        return 2
    print(fingerprint(log_key))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "fingerprint":
        return _fingerprint(args.source)
    if args.action != "new":
        from gateway.registry.cli import keys_main

        return keys_main(args)
    try:
        if _registry_mode(args):
            from gateway.registry.cli import keys_main

            return keys_main(args)
    except KeysError as exc:
        print(f"kvfence keys: {exc}", file=sys.stderr)
        return 2
    try:
        if not TENANT_ID_RE.fullmatch(args.tenant):
            raise KeysError(
                f"tenant id {args.tenant!r} is not valid: use 1 to 64 of A-Z a-z 0-9 . _ - "
                "(no spaces), the same id as in the policy's tenants"
            )
        key, digest = _mint(args, read_pepper(args))
    except KeysError as exc:
        print(f"kvfence keys: {exc}", file=sys.stderr)
        return 2
    if args.json:
        where = {"api_key": key} if args.key_file is None else {"key_file": str(args.key_file)}
        out = {"tenant": args.tenant, **where, "digest": digest}
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return 0
    if args.key_file is not None:
        print(f"API key for tenant {args.tenant} written to {args.key_file}: give it to them")
    else:
        print(f"API key for tenant {args.tenant} (shown once, store it now):\n  {key}")
    if args.digest_file is not None:
        print(f"its digest was appended to {args.digest_file}")
    else:
        print(f"add this digest to the tenant's api_keys in the policy:\n  {digest}")
    return 0
