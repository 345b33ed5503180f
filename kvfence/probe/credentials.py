"""Building the two identities from the command line: a key given inline, from an environment
variable or from a file, plus extra headers and body fields for both or for one side.

Invariant: a key is read once into its `Identity` and nothing here echoes it; a malformed
option is a `UsageError` naming the option, never the value.
"""

from __future__ import annotations

import argparse
import hmac
import re
from pathlib import Path
from typing import Any

import orjson

from kvfence.keys.secrets import SecretError, from_env, from_file
from kvfence.probe.client import Identity
from kvfence.probe.errors import UsageError

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_KEY = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: it goes into a header


def add_options(parser: argparse.ArgumentParser) -> None:
    for side in ("a", "b"):
        up = side.upper()
        group = parser.add_argument_group(f"credential {up}")
        keys = group.add_mutually_exclusive_group()
        keys.add_argument(
            f"--key-{side}", metavar="KEY", help="API key (visible to `ps`: prefer -env or -file)"
        )
        keys.add_argument(
            f"--key-{side}-env", metavar="NAME", help="read the API key from this variable"
        )
        keys.add_argument(
            f"--key-{side}-file", metavar="PATH", type=Path, help="read the API key from this file"
        )
        group.add_argument(
            f"--header-{side}",
            action="append",
            default=[],
            metavar="'NAME: VALUE'",
            help="extra header",
        )
        group.add_argument(
            f"--body-{side}", action="append", default=[], metavar="JSON", help="extra body fields"
        )
        group.add_argument(
            f"--field-{side}",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="extra string field",
        )
    both = parser.add_argument_group("both credentials")
    both.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'")
    both.add_argument("--body", action="append", default=[], metavar="JSON")
    both.add_argument("--field", action="append", default=[], metavar="NAME=VALUE")


def _key(args: argparse.Namespace, side: str) -> str | None:
    inline, env, file = (getattr(args, f"key_{side}{s}") for s in ("", "_env", "_file"))
    try:
        raw = from_env(env) if env else from_file(file) if file else None
    except SecretError as exc:
        raise UsageError(f"credential {side.upper()}: {exc}") from None
    key = raw.decode("utf-8", "replace").strip() if raw is not None else inline
    if key is not None and not _KEY.match(key):
        raise UsageError(
            f"credential {side.upper()}: the key must be printable ASCII without spaces"
        )
    return key


def _header(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.match(name) or "\r" in value or "\n" in value:
        raise UsageError(f"{option} wants 'NAME: VALUE' with a valid header name")
    return name, value


def _body(text: str, option: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise UsageError(f"{option} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{option} must be a JSON object")
    return doc


def _field(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"{option} wants NAME=VALUE")
    return name, value


def identity(args: argparse.Namespace, side: str) -> Identity:
    headers = [_header(h, "--header") for h in args.header]
    headers += [_header(h, f"--header-{side}") for h in getattr(args, f"header_{side}")]
    body: dict[str, Any] = {}
    for text in args.body:
        body |= _body(text, "--body")
    body |= dict(_field(f, "--field") for f in args.field)
    for text in getattr(args, f"body_{side}"):
        body |= _body(text, f"--body-{side}")
    body |= dict(_field(f, f"--field-{side}") for f in getattr(args, f"field_{side}"))
    return Identity(side.upper(), _key(args, side), tuple(headers), tuple(body.items()))


def _fingerprint(ident: Identity) -> bytes:
    doc = [ident.key, sorted((k.lower(), v) for k, v in ident.headers), sorted(ident.body)]
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def identities(args: argparse.Namespace) -> tuple[Identity, Identity]:
    a, b = identity(args, "a"), identity(args, "b")
    if hmac.compare_digest(_fingerprint(a), _fingerprint(b)):
        raise UsageError(
            "credentials A and B are identical: give them different keys, headers or body fields"
        )
    return a, b
