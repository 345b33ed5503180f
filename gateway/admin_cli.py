"""`kvfence admin`: talk to a running gateway's admin listener (status, a policy reload, a
canary round now, a quarantine release). The token comes from a file or an environment variable,
never the command line. Exit 0 on success, 1 when the gateway refused, 2 when it could not be
reached."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kvfence.secrets import SecretError, from_env, from_file


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8081", help="the admin listener")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--token-file", type=Path, help="file holding the admin token")
    source.add_argument("--token-env", default="KVFENCE_ADMIN_TOKEN", help="env var holding it")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("status", help="per-backend verification state (JSON)")
    sub.add_parser("reload", help="reload the policy file now (every worker); errors listed")
    for name, text in (("canary", "run a canary round now"), ("release", "end a quarantine")):
        sub.add_parser(name, help=text).add_argument("backend")


def _token(args: argparse.Namespace) -> str | None:
    try:
        if args.token_file is not None:
            return from_file(args.token_file).decode()
        return from_env(args.token_env).decode()
    except SecretError:
        if args.token_file is not None:
            raise
        return None  # read-only endpoints work without one when the gateway has none


def main(args: argparse.Namespace) -> int:
    try:
        token = _token(args)
    except SecretError as exc:
        print(f"kvfence admin: {exc}", file=sys.stderr)
        return 2
    if not args.url.startswith(("http://", "https://")):
        print("kvfence admin: --url must be http:// or https://", file=sys.stderr)
        return 2
    path = {"status": "/status", "reload": "/reload", "canary": "/canary/{}"}
    path["release"] = "/quarantine/{}/release"
    url = args.url.rstrip("/") + path[args.action].format(getattr(args, "backend", ""))
    method = "GET" if args.action == "status" else "POST"
    request = urllib.request.Request(url, method=method)  # noqa: S310 (http(s) checked above)
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=300) as resp:  # noqa: S310 (as above)
            print(json.dumps(json.loads(resp.read()), indent=2))
            return 0
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        print(f"kvfence admin: {exc.code} {body}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"kvfence admin: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
