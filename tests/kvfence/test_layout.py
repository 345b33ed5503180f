"""kvfence's layout as docs/architecture.md states it. The rules:

- imports run down kvfence's layers: keys < the contract (the top-level modules) < receipts <
  probe < the commands (`cli.py`, `*_cli.py`), so the contract never reaches the receipts;
- no kvfence module imports gateway or backend at module level; only a command may, deferred,
  to hand its work to that side (`kvfence keys` with a tenant registry);
- the backend imports from kvfence only the contract and keys, so it never needs the receipts,
  the witnessed log or the probe.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvfence
from tests.gateway.test_layout import imported, modules

ROOT = Path(kvfence.__file__).parent
BACKEND = ROOT.parent / "backend"
# Lowest first; a top-level module of kvfence (the contract) is the "" layer.
LAYERS: list[str] = ["keys", "", "receipts", "probe", "commands"]


def layer(module: str) -> int | None:
    """The layer of a kvfence module (or of a name in one), None for the package itself."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    if parts[-1] == "cli" or parts[-1].endswith("_cli"):
        return LAYERS.index("commands")
    if parts[0] in LAYERS:
        return LAYERS.index(parts[0])
    return LAYERS.index("")


def imports(module: str, source: str) -> list[tuple[str, bool]]:
    """Every module (or name in one) `source` imports, and whether at module level (outside
    every function, so an import under `try:` or `if` counts as one)."""
    tree = ast.parse(source)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    deferred = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, functions)
        for inner in ast.walk(node)
    }
    return [
        (t, id(node) not in deferred) for node in ast.walk(tree) for t in imported(module, node)
    ]


def broken_rules(module: str, source: str) -> list[str]:
    found = []
    mine = layer(module)
    for target, at_top in imports(module, source):
        side = target.split(".")[0]
        if side in {"gateway", "backend"} and (at_top or mine != LAYERS.index("commands")):
            found.append(f"{module} imports {target}")
        theirs = layer(target) if side == "kvfence" else None
        if mine is not None and theirs is not None and theirs > mine:
            found.append(f"{module} imports {target}, a layer above")
    return found


def test_kvfence_imports_run_down_its_layers_and_never_into_gateway_or_backend() -> None:
    broken = []
    for module, path in modules(ROOT):
        broken += broken_rules(module, path.read_text())
    assert broken == []


def test_every_broken_rule_is_caught() -> None:
    assert broken_rules("kvfence.handle", "from kvfence.receipts.note import Verifier")
    assert broken_rules("kvfence.handle", "def later():\n    from kvfence.receipts import note\n")
    assert broken_rules("kvfence.keys.keyfile", "from kvfence.token import claim")
    assert broken_rules("kvfence.receipts.receipt", "from kvfence.keys.cli import main")
    assert broken_rules("kvfence.receipts.receipt", "from kvfence.probe.client import Identity")
    assert broken_rules("kvfence.token", "from gateway.errors import GatewayError")
    assert broken_rules("kvfence.keys.cli", "from gateway.registry.cli import keys_main")
    assert broken_rules("kvfence.keys.cli", "def later():\n    from kvfence import cli\n") == []
    deferred = "def later():\n    from gateway.registry.cli import keys_main\n"
    assert broken_rules("kvfence.keys.cli", deferred) == []
    assert broken_rules("kvfence.keys.apikey", deferred)
    guarded = (
        "try:\n    from gateway.registry.cli import keys_main\nexcept ImportError:\n    pass\n"
    )
    assert broken_rules("kvfence.keys.cli", guarded)
    assert broken_rules("kvfence.receipts.witness_cli", "from kvfence.receipts import note") == []
    assert broken_rules("kvfence.handle", "from kvfence.keys.keyfile import b64url") == []


def beyond_the_contract(module: str, source: str) -> list[str]:
    """Imports of a backend module that reach past kvfence's contract and keys, or the gateway."""
    allowed = {None, LAYERS.index("keys"), LAYERS.index("")}
    found = []
    for target, _ in imports(module, source):
        side = target.split(".")[0]
        if side == "gateway" or (side == "kvfence" and layer(target) not in allowed):
            found.append(f"{module} imports {target}")
    return found


def test_the_backend_imports_only_the_contract_and_keys_of_kvfence() -> None:
    found = []
    for module, path in modules(BACKEND):
        found += beyond_the_contract(module, path.read_text())
    assert found == []
    assert beyond_the_contract("backend.server", "from kvfence.receipts.receipt import sign")
    assert beyond_the_contract("backend.cli", "def later():\n    from kvfence.keys import cli\n")
    assert beyond_the_contract("backend.server", "from gateway.errors import GatewayError")
    assert beyond_the_contract("backend.server", "from kvfence.handle import HandleVerifier") == []
