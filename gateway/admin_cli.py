"""`kvfence admin`: talk to a running gateway's admin listener (status, a policy reload, a
canary round now, a quarantine release). `--policy` finds the listener and its token in the
gateway's policy; otherwise `--url`, and the token from a file or an environment variable, never
the command line. A refusal is printed one line per error. Exit 0 on success, 1 when the gateway
refused, 2 when it could not be reached."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from gateway.registry.client import connect_url
from kvfence.keys.secrets import SecretError, from_env, from_file

DEFAULT_URL = "http://127.0.0.1:8081"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="FILE", help="the gateway's policy: its admin URL and token"
    )
    parser.add_argument(
        "--url", help=f"the admin listener (default: the policy's, else {DEFAULT_URL})"
    )
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


def _from_policy(path: str) -> tuple[str, str | None]:
    """The admin URL and token the policy names, read leniently (a policy that would not load
    still names its gateway's admin listener, so a failed reload can be asked about)."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SecretError(f"cannot read the admin listener from {path}: {exc}") from None
    gateway = doc.get("gateway") if isinstance(doc, dict) else None
    admin = gateway.get("admin") if isinstance(gateway, dict) else None
    admin = admin if isinstance(admin, dict) else {}
    host, port = str(admin.get("host", "127.0.0.1")), admin.get("port", 8081)
    ref, token = admin.get("token"), None
    if isinstance(ref, dict) and set(ref) == {"file"}:
        token = from_file(Path(path).parent / str(ref["file"])).decode()
    elif isinstance(ref, dict) and set(ref) == {"env"}:
        token = from_env(str(ref["env"])).decode()
    return connect_url(host, int(port)), token


def _refusal(code: int, raw: bytes) -> list[str]:
    """A refusal as lines: its message, then each error it lists (a reload's), one a line."""
    try:
        error = json.loads(raw)["error"]
        lines = [f"kvfence admin: {code} {error['code']}: {error['message']}"]
        return lines + [str(e) for e in error.get("errors", [])]
    except (ValueError, KeyError, TypeError):
        return [f"kvfence admin: {code} {raw.decode(errors='replace')[:300]}"]


def main(args: argparse.Namespace) -> int:
    policy_url, policy_token = None, None
    try:
        if args.policy:
            policy_url, policy_token = _from_policy(args.policy)
        token = _token(args) if (args.token_file or not policy_token) else None
    except (SecretError, ValueError) as exc:
        print(f"kvfence admin: {exc}", file=sys.stderr)
        return 2
    token = token or policy_token
    args.url = args.url or policy_url or DEFAULT_URL
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
        with exc:  # an error answer holds its connection until closed
            print("\n".join(_refusal(exc.code, exc.read())), file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        hint = (
            ""
            if args.policy or args.url != DEFAULT_URL
            else (" (a gateway on other ports: --policy FILE, or --url)")
        )
        print(f"kvfence admin: cannot reach {args.url}: {reason}{hint}", file=sys.stderr)
        return 2
