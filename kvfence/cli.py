"""The `kvfence` command. Each subcommand lives in the module that owns it and is imported only
when chosen, so a gateway-only install never imports torch."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from kvfence import heap

# subcommand -> (module, one-line help). Each module defines
# `configure(parser: argparse.ArgumentParser) -> None` and `main(args: argparse.Namespace) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "gateway": ("gateway.cli", "run the gateway in front of the backends a policy names"),
    "policy": ("gateway.policy.cli", "check a policy file"),
    "keys": ("kvfence.keys.cli", "a tenant's API keys: new, list, revoke, expire"),
    "tenants": ("gateway.registry.cli", "the tenant registry: add, set, list, remove"),
    "keygen": ("kvfence.keys.keygen_cli", "create an Ed25519 key pair for handles or attestations"),
    "backend": ("backend.cli", "run the kvfence inference backend"),
    "audit": ("gateway.audit.cli", "verify a tamper-evident audit log"),
    "receipt": ("kvfence.receipts.cli", "verify an answer's receipt offline"),
    "witness": (
        "kvfence.receipts.witness_cli",
        "check and cosign a gateway's audit log checkpoints",
    ),
    "admin": ("gateway.admin_cli", "status, reload, canary rounds, quarantine release"),
    "probe": (
        "kvfence.probe.cli",
        "scan an OpenAI-compatible endpoint for cross-credential cache sharing",
    ),
}


# Servers: they load with the collector held off and freeze what they loaded (kvfence.heap).
SERVERS = frozenset({"gateway", "backend"})

# A module a command may miss -> the extra that installs it (tests/kvfence/test_cli_extras.py
# checks each against pyproject.toml). A module shared by several extras names the command's own.
EXTRA_OF_MODULE: dict[str, str] = {
    "redis": "redis",
    "asyncpg": "postgres",
    "opentelemetry": "otel",
    "torch": "backend",
    "numpy": "backend",
    "gguf": "backend",
    "tokenizers": "tokenizer",  # the gateway's exact-mode detective (`detective.tokenizer`)
    "jinja2": "tokenizer",
    "safetensors": "backend",
    "scipy": "probe-report",
    "matplotlib": "probe-report",
}
EXTRA_OF_COMMAND: dict[str, str] = {"backend": "backend", "probe": "probe"}
# The backend's own extra holds the tokenizer's modules too: it names itself for them.
OWN_EXTRA_MODULES: dict[str, frozenset[str]] = {"backend": frozenset({"tokenizers", "jinja2"})}


def extra_for(command: str, module: str | None) -> str:
    """The extra that provides `module` (a missing import's top-level name) for `command`."""
    top = (module or "").partition(".")[0]
    if top in OWN_EXTRA_MODULES.get(command, frozenset()):
        return EXTRA_OF_COMMAND[command]
    return EXTRA_OF_MODULE.get(top) or EXTRA_OF_COMMAND.get(command, "gateway")


class _Command(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...
    def main(self, args: argparse.Namespace) -> int: ...


def _usage() -> str:
    lines = ["usage: kvfence COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else 2
    if argv[0] in {"-V", "--version"}:
        from kvfence import __version__

        print(f"kvfence {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"kvfence: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    with heap.loading() if name in SERVERS else contextlib.nullcontext():
        return _command(name, argv[1:])


def _command(name: str, argv: list[str]) -> int:
    module_name, text = COMMANDS[name]
    try:
        module = cast(_Command, importlib.import_module(module_name))
    except ImportError as exc:
        extra = extra_for(name, exc.name)
        print(
            f"kvfence {name}: missing dependency ({exc.name}); "
            f"install it with: pip install 'kvfence[{extra}]'",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog=f"kvfence {name}", description=text)
    module.configure(parser)
    args = parser.parse_args(argv)
    return module.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
