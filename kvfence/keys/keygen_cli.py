"""`kvfence keygen`: create an Ed25519 key pair (ID.key, mode 0600, and ID.pub, a one-entry
trust file) and optionally add the public key to a trust file. Never prints the private key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from kvfence.keys.keyfile import (
    KeyFileError,
    add_to_trust_file,
    check_key_id,
    generate_key,
    trust_entry,
    write_private_key,
    write_trust_file,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", required=True, help="key id (A-Z a-z 0-9 . _ -, up to 64)")
    parser.add_argument("--out", required=True, type=Path, help="directory for ID.key and ID.pub")
    parser.add_argument("--trust", type=Path, help="trust file to create or add the key to")
    parser.add_argument("--force", action="store_true", help="overwrite an existing ID.key")


def main(args: argparse.Namespace) -> int:
    try:
        key_id = check_key_id(args.id)
        out: Path = args.out
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = generate_key()
        write_private_key(out / f"{key_id}.key", key, overwrite=args.force)
        entry = trust_entry(key_id, key.public_key())
        write_trust_file(out / f"{key_id}.pub", [entry])
        if args.trust is not None:
            add_to_trust_file(args.trust, key_id, key.public_key())
    except (KeyFileError, OSError) as exc:
        print(f"kvfence keygen: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out / (key_id + '.key')} (private, mode 0600) and {out / (key_id + '.pub')}")
    if args.trust is not None:
        print(f"trusted in {args.trust}")
    print("trust-file entry:")
    print(orjson.dumps(entry).decode())
    return 0
