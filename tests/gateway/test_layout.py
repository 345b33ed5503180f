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


def modules(root: Path = ROOT) -> list[tuple[str, Path]]:
    """Every module under package folder `root`, by its dotted name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def test_every_gateway_module_has_a_layer() -> None:
    assert [m for m, _ in modules() if m != "gateway" and layer(m) is None] == []


def imported(module: str, node: ast.AST) -> list[str]:
    """The gateway modules (or names in them) an import statement reaches, in every form:
    `import gateway.x`, `from gateway.x import y`, `from gateway import x`, relative ones."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = module.split(".")[: -node.level] if node.level else []
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def upward_imports(module: str, source: str) -> list[str]:
    """Imports of `module` (module-level or deferred, any form) from a layer above its own."""
    mine = layer(module)
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in imported(module, node):
            if not target.startswith("gateway."):
                continue
            theirs = layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module} imports {target}")
    return found


def test_imports_run_down_the_layers() -> None:
    upward = []
    for module, path in modules():
        upward += upward_imports(module, path.read_text())
    assert upward == []


def test_every_upward_import_form_is_caught() -> None:
    forms = [
        "from gateway.app import CHAIN",
        "import gateway.routing.failover",
        "from gateway import app",
        "from gateway.routing import failover",
        "def later():\n    from gateway import app\n",
        "def later():\n    import gateway.filters.authn\n",
        "from ..routing import failover",
    ]
    for source in forms:
        assert upward_imports("gateway.policy.model", source), source
    assert upward_imports("gateway.policy.model", "from gateway.errors import GatewayError") == []


def test_the_top_level_holds_composition_and_core_only() -> None:
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MAX, top


def test_the_gateway_never_imports_the_backend() -> None:
    """The two sides share only `kvfence` (tests/kvfence/test_layout.py holds its own rules)."""
    found = []
    for module, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            found += [t for t in imported(module, node) if t.split(".")[0] == "backend"]
    assert found == []
