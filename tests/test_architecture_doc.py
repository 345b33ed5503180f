"""docs/architecture.md's module map names every module of kvfence, gateway and backend, each
in the entry of its own folder, so a module added without a word on what it is fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvfence", "gateway", "backend")
DESCRIPTION_COLUMN = 29  # a line indented this far continues the entry above it


def module_map(doc: str) -> list[str]:
    """The lines of the fenced block that maps the packages (it opens with `kvfence/`)."""
    blocks = re.findall(r"^```\n(.*?)^```", doc, flags=re.S | re.M)
    return next(b for b in blocks if b.startswith("kvfence/")).splitlines()


def folder_texts(lines: list[str]) -> dict[str, str]:
    """Each folder's own text, by path (`gateway/audit/answer/`): its entry and the entries of
    the files directly in it, continuation lines included; never a subfolder's entries."""
    texts: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder path) of the folders open above
    owner = ""
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= DESCRIPTION_COLUMN:
            texts.setdefault(owner, []).append(line)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        name = line.split()[0]
        if name.endswith("/"):
            owner = parent + name
            stack.append((indent, owner))
        else:
            owner = parent
        texts.setdefault(owner, []).append(line)
    return {folder: "\n".join(text) for folder, text in texts.items()}


def unnamed(texts: dict[str, str], modules: list[Path]) -> list[str]:
    """The modules (paths relative to the repository) their folder's text does not name."""
    missing = []
    for path in modules:
        folder = "".join(f"{part}/" for part in path.parts[:-1])
        if not re.search(rf"(?<![\w/]){re.escape(path.stem)}\b", texts.get(folder, "")):
            missing.append(str(path))
    return missing


def package_modules() -> list[Path]:
    return [
        path.relative_to(ROOT)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.stem != "__init__"
    ]


def test_the_module_map_names_every_module() -> None:
    texts = folder_texts(module_map((ROOT / "docs" / "architecture.md").read_text()))
    assert unnamed(texts, package_modules()) == []


def test_a_module_named_only_in_another_folder_is_missing() -> None:
    lines = [
        "gateway/                     async proxy",
        "  app.py                     routes, the filter chain",
        "  relay/                     plain.py (a plain answer), stream.py (a stream)",
        "                             session.py (the pooled upstream session)",
        "  audit/                     exchange.py (the one object a relay talks to)",
        "    answer/                  step.py (pass, hold or drop)",
    ]
    texts = folder_texts(lines)
    assert unnamed(texts, [Path("gateway/app.py"), Path("gateway/relay/session.py")]) == []
    assert unnamed(texts, [Path("gateway/audit/answer/step.py")]) == []
    assert unnamed(texts, [Path("gateway/audit/step.py")]) == ["gateway/audit/step.py"]
    assert unnamed(texts, [Path("gateway/plain.py")]) == ["gateway/plain.py"]
    assert unnamed(texts, [Path("gateway/relay/app.py")]) == ["gateway/relay/app.py"]
    assert unnamed(texts, [Path("gateway/relay/headers.py")]) == ["gateway/relay/headers.py"]
