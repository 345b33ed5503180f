"""What a bare GPU machine lacks, packed here into `.carry/` and unpacked there: x86-64 cp312
wheels of the packages kvfence needs beyond what that machine's python has, and the model file
in parts small enough for one transfer each.

Invariant: standard library only (it runs before anything is installed); `unpack` is idempotent
and installs a wheel only when its module cannot be imported or, for kvfence's own needs, is
older than the carried one (the machine's other copies stay as they are); a joined model file
is used only when its SHA-256 matches the manifest.

    .venv/bin/python -m bench.gpu.carry pack [--model smollm2|FILE] [--part-mib 52]   # here
    python3 -m bench.gpu.carry unpack                                   # there, on every call
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from importlib.machinery import PathFinder
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CARRY = REPO_ROOT / ".carry"
STASH = Path("/tmp/kvfence-carry")  # outside the tree: kept while the machine stays warm
SITE = Path("/tmp/site")
# distribution -> module. kvfence's own needs first; the rest normally come with torch or
# transformers and are unpacked only where missing.
PACKAGES = {
    "orjson": "orjson",
    "cryptography": "cryptography",
    "cffi": "cffi",
    "pycparser": "pycparser",
    "rfc8785": "rfc8785",
    "gguf": "gguf",
    "accelerate": "accelerate",  # transformers' GGUF loader asks for it
    "psutil": "psutil",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "jinja2": "jinja2",
    "markupsafe": "markupsafe",
}
# kvfence's own needs: a copy on the machine older than the carried one is shadowed by it
# (the rest are taken as the machine has them, matched to its torch and transformers).
OWN = frozenset({"orjson", "cryptography", "cffi", "pycparser", "rfc8785", "gguf"})
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True, slots=True)
class Manifest:
    """The model file cut into parts: its name, size, hash and the parts in order."""

    file: str
    size: int
    sha256: str
    parts: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Manifest:
        raw = json.loads(path.read_text())
        return cls(raw["file"], int(raw["size"]), raw["sha256"], tuple(raw["parts"]))


def download_wheels(dest: Path) -> list[Path]:
    """Each package at the version installed here (the one the tests ran with), cp312 x86-64."""
    dest.mkdir(parents=True, exist_ok=True)
    for dist in PACKAGES:
        pin = f"{dist}=={importlib.metadata.version(dist)}"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.12", "--implementation", "cp", "-d", str(dest),
                   pin]  # fmt: skip
        for platform in PLATFORMS:
            command += ["--platform", platform]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return sorted(dest.glob("*.whl"))


def split_model(model: Path, dest: Path, part_bytes: int) -> Manifest:
    """Cut `model` into parts of at most `part_bytes`; the manifest names them and the hash."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.part*"):
        old.unlink()
    digest = hashlib.sha256()
    parts: list[str] = []
    with model.open("rb") as src:
        while chunk := src.read(part_bytes):
            digest.update(chunk)
            part = dest / f"{model.name}.part{len(parts)}"
            part.write_bytes(chunk)
            parts.append(part.name)
    manifest = Manifest(model.name, model.stat().st_size, digest.hexdigest(), tuple(parts))
    (dest / "manifest.json").write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def pack(args: argparse.Namespace) -> int:
    from backend.model.resolve import resolve_model  # here only: the backend is installed

    carry = Path(args.dir)
    model = resolve_model(args.model).path
    if not model.is_file():
        raise SystemExit(f"{model}: pack carries one model file (a .gguf), not a directory")
    wheels = download_wheels(carry / "wheels")
    manifest = split_model(model, carry / "model", args.part_mib << 20)
    wheel_mib = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheels: {len(wheels)} files, {wheel_mib:.1f} MiB in {carry / 'wheels'}")
    for name in manifest.parts:
        print(f"model part {name}: {(carry / 'model' / name).stat().st_size / 2**20:.1f} MiB")
    print(f"model {manifest.file}: {manifest.size / 2**20:.1f} MiB, sha256 {manifest.sha256}")
    return 0


def stash_parts(carry: Path, stash: Path) -> Manifest | None:
    """Copy the parts this call brought to `stash`; the manifest, or None when none came."""
    manifest_file = carry / "model" / "manifest.json"
    if not manifest_file.is_file():
        return None
    stash.mkdir(parents=True, exist_ok=True)
    for part in (carry / "model").glob("*.part*"):
        kept = stash / part.name
        if not kept.is_file() or kept.stat().st_size != part.stat().st_size:
            shutil.copyfile(part, kept)
    return Manifest.read(manifest_file)


def join_parts(manifest: Manifest, stash: Path) -> Path | None:
    """The whole model file once every part is in `stash` and the hash matches; else None."""
    target = stash / manifest.file
    parts = [stash / p for p in manifest.parts]
    if target.is_file() and _sha256(target) == manifest.sha256:
        return target
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        print(f"model: waiting for {', '.join(missing)} (carry it in the next call)")
        return None
    with target.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    if _sha256(target) != manifest.sha256:
        target.unlink()
        raise SystemExit("model: the joined file's SHA-256 does not match the manifest")
    return target


def install_missing(wheels: Path, site: Path) -> list[str]:
    """Unzip into `site` each carried wheel whose module this interpreter cannot import."""
    site.mkdir(parents=True, exist_ok=True)
    installed = []
    for wheel in sorted(wheels.glob("*.whl")):
        dist = wheel.name.split("-")[0].lower()
        module = PACKAGES.get(dist, dist)
        if PathFinder.find_spec(module, [str(site)]):
            continue  # unpacked by an earlier call
        if importlib.util.find_spec(module) and not (dist in OWN and _older(dist, wheel.name)):
            continue  # the machine's own copy, recent enough
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        installed.append(wheel.name)
    return installed


def _older(dist: str, wheel: str) -> bool:
    """Whether the installed `dist` is older than the wheel's version (leading numbers)."""
    try:
        present = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False  # importable but unversioned: leave it
    return _numbers(present) < _numbers(wheel.split("-")[1])


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def unpack(args: argparse.Namespace) -> int:
    carry, stash = Path(args.dir), Path(args.stash)
    manifest = stash_parts(carry, stash)
    model = join_parts(manifest, stash) if manifest else None
    if model is not None:
        print(f"model: {model} ({model.stat().st_size / 2**20:.1f} MiB, SHA-256 checked)")
    if (carry / "wheels").is_dir():
        added = install_missing(carry / "wheels", Path(args.site))
        print(f"wheels unpacked into {args.site}: {', '.join(added) or 'none needed'}")
    return 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    packer = sub.add_parser("pack", help="fill .carry/ here: wheels and model parts")
    packer.add_argument("--model", default="smollm2", help="smollm2 or a .gguf file")
    packer.add_argument("--part-mib", type=int, default=52)
    packer.add_argument("--dir", default=str(CARRY))
    unpacker = sub.add_parser("unpack", help="there: stash parts, join the model, add wheels")
    unpacker.add_argument("--dir", default=str(CARRY))
    unpacker.add_argument("--stash", default=str(STASH))
    unpacker.add_argument("--site", default=str(SITE))
    args = parser.parse_args()
    raise SystemExit(pack(args) if args.action == "pack" else unpack(args))


if __name__ == "__main__":
    main()
