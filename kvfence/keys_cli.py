"""`kvfence keys new`: mint a tenant API key and print it once with its policy digest.

The pepper comes from an environment variable, a file, or the policy's `api_key_pepper`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import yaml

from kvfence.apikey import MIN_PEPPER_BYTES, key_digest, mint_key
from kvfence.secrets import SecretError, from_env, from_file


class PepperError(Exception):
    """The pepper could not be read or is too short."""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    new = sub.add_parser("new", help="mint a key for a tenant")
    new.add_argument("--tenant", required=True, help="tenant id the key belongs to")
    new.add_argument("--json", action="store_true", help="print one JSON object")
    src = new.add_mutually_exclusive_group()
    src.add_argument("--pepper-env", metavar="NAME", help="env variable (default KVFENCE_PEPPER)")
    src.add_argument("--pepper-file", metavar="PATH", help="file holding the pepper")
    src.add_argument("--policy", metavar="FILE", help="read the pepper reference from a policy")


def _secret(read: Callable[[], bytes]) -> bytes:
    try:
        return read()
    except SecretError as exc:
        raise PepperError(str(exc)) from exc


def _from_policy(path: str) -> bytes:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        ref = doc["gateway"]["api_key_pepper"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise PepperError(f"{path}: no readable gateway.api_key_pepper") from exc
    if isinstance(ref, dict) and set(ref) == {"env"}:
        return _secret(lambda: from_env(str(ref["env"])))
    if isinstance(ref, dict) and set(ref) == {"file"}:
        # As in the policy itself, a file is relative to the policy's folder.
        return _secret(lambda: from_file(Path(path).parent / str(ref["file"])))
    raise PepperError(f"{path}: gateway.api_key_pepper must be {{env: NAME}} or {{file: PATH}}")


def read_pepper(args: argparse.Namespace) -> bytes:
    if args.pepper_file:
        pepper = _secret(lambda: from_file(Path(args.pepper_file)))
    elif args.policy:
        pepper = _from_policy(args.policy)
    else:
        pepper = _secret(lambda: from_env(args.pepper_env or "KVFENCE_PEPPER"))
    if len(pepper) < MIN_PEPPER_BYTES:
        raise PepperError(f"the pepper must be at least {MIN_PEPPER_BYTES} bytes")
    return pepper


def main(args: argparse.Namespace) -> int:
    try:
        pepper = read_pepper(args)
    except PepperError as exc:
        print(f"kvfence keys: {exc}", file=sys.stderr)
        return 2
    key = mint_key()
    digest = key_digest(pepper, key)
    if args.json:
        sys.stdout.write(
            orjson.dumps({"tenant": args.tenant, "api_key": key, "digest": digest}).decode() + "\n"
        )
        return 0
    print(f"API key for tenant {args.tenant} (shown once, store it now):\n  {key}")
    print(f"add this digest to the tenant's api_keys in the policy:\n  {digest}")
    return 0
