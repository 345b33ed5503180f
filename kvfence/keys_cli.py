"""`kvfence keys new`: mint a tenant API key and print it once with its policy digest.

The pepper comes from an environment variable, a file, or the policy's `api_key_pepper`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson
import yaml

from kvfence.apikey import MIN_PEPPER_BYTES, key_digest, mint_key


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


def _from_env(name: str) -> bytes:
    value = os.environ.get(name)
    if not value:
        raise PepperError(f"environment variable {name} is not set")
    return value.encode("utf-8")


def _from_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise PepperError(f"cannot read pepper file {path}: {exc.strerror}") from exc


def _from_policy(path: str) -> bytes:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        ref = doc["gateway"]["api_key_pepper"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise PepperError(f"{path}: no readable gateway.api_key_pepper") from exc
    if isinstance(ref, dict) and set(ref) == {"env"}:
        return _from_env(str(ref["env"]))
    if isinstance(ref, dict) and set(ref) == {"file"}:
        return _from_file(str(ref["file"]))
    raise PepperError(f"{path}: gateway.api_key_pepper must be {{env: NAME}} or {{file: PATH}}")


def read_pepper(args: argparse.Namespace) -> bytes:
    if args.pepper_file:
        pepper = _from_file(args.pepper_file)
    elif args.policy:
        pepper = _from_policy(args.policy)
    else:
        pepper = _from_env(args.pepper_env or "KVFENCE_PEPPER")
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
