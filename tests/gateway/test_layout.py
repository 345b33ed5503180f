"""The gateway's layout as docs/architecture.md states it: a small top level, and imports that
run down the layers only (a module never imports from a layer above its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

ROOT = Path(gateway.__file__).parent
# Lowest first, as in docs/architecture.md ("Every folder names what it is").
LAYERS: list[set[str]] = [
    {"errors", "metrics", "entropy"},
    {"inputs"},
    {"audit.chain", "audit.sse"},
    {"adapters"},
    {"policy"},
    {"control"},
    {"listener"},
    {"fleet"},
    {"verify"},
    {"state"},
    {"audit", "receipts"},
    {"relay"},
    {"routing"},
    {"filters"},
    {"api"},
    {"app", "server", "cli", "admin", "admin_cli", "shared", "observe", "preflight", "registry"},
]
TOP_LEVEL_MAX = 14


def layer(module: str) -> int | None:
    parts = module.split(".")[1:]
    if not parts:
        return None
    for name in (".".join(parts[:2]), parts[0]):
        for i, group in enumerate(LAYERS):
            if name in group:
                return i
    return None


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def test_every_gateway_module_has_a_layer() -> None:
    assert [m for m, _ in modules() if m != "gateway" and layer(m) is None] == []


def test_imports_run_down_the_layers() -> None:
    upward = []
    for module, path in modules():
        mine = layer(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gateway."):
                theirs = layer(node.module or "")
                if mine is not None and theirs is not None and theirs > mine:
                    upward.append(f"{module} imports {node.module}")
    assert upward == []


def test_the_top_level_holds_composition_and_core_only() -> None:
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MAX, top
