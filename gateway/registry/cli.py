"""`kvfence tenants add|set|list|remove` and the registry actions of `kvfence keys` (new with a
registry, list, revoke, expire): against a running gateway through its admin listener, or
offline against the registry file (`gateway.registry.client`). Exit 0 done, 2 refused."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.policy.node import PolicyError
from gateway.policy.registry import RegistryError
from gateway.policy.registry_view import parse_budgets, parse_expiry, parse_limits, spent_text
from gateway.registry.client import (
    Target,
    add_target_options,
    fail,
    offline_add,
    offline_expire,
    offline_keys,
    offline_new_key,
    offline_remove,
    offline_revoke,
    offline_set,
    offline_tenants,
    run,
    table,
    target,
    when,
)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add a tenant to the registry")
    add.add_argument("tenant", help="tenant id ([A-Za-z0-9._-], 1-64)")
    add.add_argument("--model", action="append", default=[], help="a model it may use (repeat; "
                     "default: every model the policy serves)")  # fmt: skip
    add.add_argument("--scope", choices=("tenant", "user", "session", "request"))
    add.add_argument("--scope-header", help="header carrying the user or session id")
    add.add_argument("--limit", action="append", default=[], metavar="NAME=N",
                     help="requests_per_s, burst, concurrent, tokens_per_min (repeat)")  # fmt: skip
    add.add_argument("--budget", action="append", default=[], metavar="PERIOD=TOKENS",
                     help="tokens per hour, day or month (repeat)")  # fmt: skip
    add.add_argument("--added-by", help="who adds it (shown by list; scripts name themselves)")
    add_target_options(add)
    change = sub.add_parser("set", help="change a registry tenant's scope, models, limits, "
                            "budgets (every worker, within a second)")  # fmt: skip
    change.add_argument("tenant")
    change.add_argument("--model", action="append", default=[],
                        help="a model it may use (repeat; replaces the list)")  # fmt: skip
    change.add_argument("--scope", choices=("tenant", "user", "session", "request"))
    change.add_argument("--scope-header", help="header carrying the user or session id ('': none)")
    change.add_argument("--limit", action="append", default=[], metavar="NAME=N",
                        help="set one limit (repeat; NAME=0 removes it)")  # fmt: skip
    change.add_argument("--clear-limits", action="store_true", help="remove every limit first")
    change.add_argument("--budget", action="append", default=[], metavar="PERIOD=TOKENS",
                        help="set one budget (repeat; PERIOD=0 removes it)")  # fmt: skip
    change.add_argument("--no-budgets", action="store_true", help="remove every budget first")
    change.add_argument("--changed-by", help="who changes it (shown by list --json)")
    add_target_options(change)
    listing = sub.add_parser("list", help="every tenant: the policy file's and the registry's")
    add_target_options(listing)
    remove = sub.add_parser("remove", help="remove a registry tenant and its keys")
    remove.add_argument("tenant")
    add_target_options(remove)


def main(args: argparse.Namespace) -> int:
    try:
        t = target(args)
        if args.action == "list":
            return _print(args, t, run(t, lambda t: t.call("GET", "/tenants"), offline_tenants))
        if args.action == "add":
            spec = {"id": args.tenant, "scope": args.scope, "models": args.model,
                    "scope_header": args.scope_header, "limits": parse_limits(args.limit),
                    "budgets": parse_budgets(args.budget), "added_by": args.added_by}  # fmt: skip
            out = run(t, lambda t: t.call("POST", "/tenants", spec),
                      lambda p, f: offline_add(p, f, spec))  # fmt: skip
            return _print(args, t, out)
        if args.action == "set":
            changes = _changes(args)
            out = run(t, lambda t: t.call("POST", f"/tenants/{args.tenant}/set", changes),
                      lambda p, f: offline_set(p, f, args.tenant, changes))  # fmt: skip
            return _print(args, t, out)
        out = run(t, lambda t: t.call("POST", f"/tenants/{args.tenant}/remove"),
                  lambda p, f: offline_remove(p, f, args.tenant))  # fmt: skip
        return _print(args, t, out)
    except (RegistryError, PolicyError) as exc:
        return fail("tenants", exc)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The options given to `tenants set`, and only those (what is not given stays)."""
    given: dict[str, Any] = {"models": args.model, "scope": args.scope,
                             "limits": parse_limits(args.limit),
                             "budgets": parse_budgets(args.budget, removable=True),
                             "clear_limits": args.clear_limits,
                             "clear_budgets": args.no_budgets}  # fmt: skip
    changes = {k: v for k, v in given.items() if v not in (None, [], {}, False)}
    if args.scope_header is not None:
        changes["scope_header"] = args.scope_header or None
    if args.changed_by:
        changes["changed_by"] = args.changed_by
    return changes


def _print(args: argparse.Namespace, t: Target, out: Any) -> int:
    if args.json:
        print(_dumps(out))
        return 0
    if "tenants" in out:
        rows = [["TENANT", "SOURCE", "SCOPE", "MODELS", "KEYS", "BUDGETS", "SPENT", "ADDED"]]
        for r in out["tenants"]:
            budgets = ",".join(f"{k}={v}" for k, v in r.get("budgets", {}).items()) or "-"
            added = when(r["added"]) if r.get("added") else "-"
            if r.get("added_by"):
                added += f" by {r['added_by']}"
            rows.append([r["id"], r["source"], r["scope"], ",".join(r["models"]),
                         str(r["active_keys"]), budgets, spent_text(r), added])  # fmt: skip
        print(table(rows))
        for problem in out.get("problems", []):
            print(f"left out: {problem}", file=sys.stderr)
    elif "added" in out:
        a = out["added"]
        print(f"tenant {a['id']} added (scope {a['scope']}, models {', '.join(a['models'])}); "
              f"give it a key: kvfence keys new --tenant {a['id']} ...")  # fmt: skip
    elif "changed" in out:
        c = out["changed"]
        budgets = ",".join(f"{k}={v}" for k, v in (c.get("budgets") or {}).items()) or "none"
        limits = ",".join(f"{k}={v}" for k, v in (c.get("limits") or {}).items()) or "none"
        print(f"tenant {c['id']} changed (scope {c['scope']}, models {', '.join(c['models'])}, "
              f"limits {limits}, budgets {budgets}): every worker applies it within a "
              "second")  # fmt: skip
    elif "removed" in out:
        r = out["removed"]
        print(f"tenant {r['id']} removed with its {r['keys_removed']} keys")
    print(f"({t.said})", file=sys.stderr)
    return 0


def _dumps(out: Any) -> str:
    import json

    return json.dumps(out, indent=2)


# `kvfence keys` with a registry (kvfence.keys.cli hands these over).


def keys_main(args: argparse.Namespace) -> int:
    try:
        t = target(args)
        if args.action == "list":
            tenant = getattr(args, "tenant", None)
            path = "/keys" + (f"?tenant={tenant}" if tenant else "")
            out = run(t, lambda t: t.call("GET", path), lambda p, f: offline_keys(p, f, tenant))
            return _print_keys(args, t, out)
        if args.action == "new":
            return _new_key(args, t)
        if args.action == "revoke":
            out = run(t, lambda t: t.call("POST", f"/keys/{args.key}/revoke"),
                      lambda p, f: offline_revoke(p, f, args.key))  # fmt: skip
            return _print_keys(args, t, out)
        at = parse_expiry(args.at)
        assert at is not None
        out = run(t, lambda t: t.call("POST", f"/keys/{args.key}/expire", {"at": at}),
                  lambda p, f: offline_expire(p, f, args.key, at))  # fmt: skip
        return _print_keys(args, t, out)
    except (RegistryError, PolicyError) as exc:
        return fail("keys", exc)


def _new_key(args: argparse.Namespace, t: Target) -> int:
    fd = None
    if args.key_file is not None:  # before the key exists: a failure leaves nothing behind
        try:
            fd = os.open(args.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise RegistryError(f"{args.key_file} exists: remove it or name a new file") from None
        except OSError as exc:
            raise RegistryError(f"cannot create {args.key_file}: {exc.strerror}") from None
    body = {"tenant": args.tenant, "label": args.label or "", "budgets": parse_budgets(args.budget),
            "expires": parse_expiry(args.expires)}  # fmt: skip
    try:
        out = run(t, lambda t: t.call("POST", "/keys", body),
                  lambda p, f: offline_new_key(p, f, body))  # fmt: skip
    except BaseException:
        if fd is not None:
            os.close(fd)
            Path(args.key_file).unlink(missing_ok=True)
        raise
    key = out.pop("key")
    if fd is not None:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key + "\n")
    if args.json:
        where = {"api_key": key} if fd is None else {"key_file": str(args.key_file)}
        print(_dumps({**out, **where}))
        return 0
    expires = f", expires {when(out['expires'])}" if out.get("expires") else ""
    label = f" ({out['label']})" if out.get("label") else ""
    if fd is None:
        print(f"API key {out['id']}{label} for tenant {out['tenant']}{expires} "
              f"(shown once, store it now):\n  {key}")  # fmt: skip
    else:
        print(f"API key {out['id']}{label} for tenant {out['tenant']}{expires} written to "
              f"{args.key_file}: give it to them")  # fmt: skip
    print(f"({t.said})", file=sys.stderr)
    return 0


def _print_keys(args: argparse.Namespace, t: Target, out: Any) -> int:
    if args.json:
        print(_dumps(out))
        return 0
    if "keys" in out:
        rows = [["KEY", "TENANT", "LABEL", "STATE", "CREATED", "EXPIRES", "SOURCE"]]
        for k in out["keys"]:
            created = when(k["created"]) if k.get("created") else "-"
            rows.append([k["id"], k["tenant"], k["label"] or "-", k["state"], created,
                         when(k["expires"]), k["source"]])  # fmt: skip
        print(table(rows))
    elif "revoked" in out:
        r = out["revoked"]
        print(f"key {r['id']} of tenant {r['tenant']} revoked (refused from now on)")
    elif "expired" in out:
        r = out["expired"]
        print(f"key {r['id']} of tenant {r['tenant']} expires {when(r['expires'])}")
    print(f"({t.said})", file=sys.stderr)
    return 0
