"""`kvfence policy check FILE`: print every policy error, or a one-line summary."""

from __future__ import annotations

import argparse
import sys

from gateway.policy.load import load_policy
from gateway.policy.node import PolicyError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="validate a policy file")
    check.add_argument("file", help="policy YAML file")


def main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 1
    print(policy.summary())
    return 0
