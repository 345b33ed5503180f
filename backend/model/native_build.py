"""Building our CPU kernels' library (backend.model.native_c) with the host's C compiler, once per
source, compiler and flags: into the user's cache folder on first use, or ahead of time into a
folder an image ships (`python -m backend.model.native_build DIR`, found again through
KVFENCE_NATIVE_PREBUILT), for containers whose writable folders may not hold code that runs.

Invariant: a library is only ever loaded from a folder no one but this user (or, for a prebuilt
one, root) may write to, and a file no one else may write: a library loaded runs as us.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from backend.model.native_c import SOURCE

PREBUILT_ENV: Final = "KVFENCE_NATIVE_PREBUILT"  # a folder of libraries built ahead of time
# No contraction of a * b + c into one rounding behind our back: the source says where it fuses.
_FLAGS: Final = (
    "-O3", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-fopenmp", "-shared",
    "-fPIC",
)  # fmt: skip
_LIBS: Final = ("-lm",)


def compiler() -> str | None:
    """The C compiler this process's own PATH (or CC) names, or None."""
    return shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def library(cc: str) -> Path:
    """The built library for this source, compiler and flags: a prebuilt one where the folder
    KVFENCE_NATIVE_PREBUILT names holds it (and only root or this user may write there), else
    one in the cache folder, compiled now if it is not there yet."""
    name = _name(cc)
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt and (Path(prebuilt) / name).is_file():
        lib = Path(prebuilt) / name
        _owned(lib.parent, root=True)
        return _owned(lib, root=True)
    return _compile(cc, _cache_folder(), name)


def prebuild(folder: Path, cc: str) -> Path:
    """Compiles the library into `folder` (made if missing), whatever this host's CPU."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    return _compile(cc, folder, _name(cc))


def _name(cc: str) -> str:
    # The compiler is the one this process's own PATH (or CC) names: no input from a request.
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)  # noqa: S603
    key = hashlib.sha256("\0".join([SOURCE, version.stdout, *_FLAGS]).encode()).hexdigest()[:16]
    return f"kvfence-gemv-{key}.so"


def _compile(cc: str, folder: Path, name: str) -> Path:
    """Compiled once into folder/name (written under a temporary name, then renamed: processes
    starting together never load half a file)."""
    lib = folder / name
    if not lib.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so")
        os.close(fd)
        src = Path(tmp).with_suffix(".c")
        try:
            src.write_text(SOURCE)
            cmd = [cc, *_FLAGS, str(src), "-o", tmp, *_LIBS]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # noqa: S603
            if done.returncode:
                raise OSError(done.stderr.strip() or f"{cc} exited {done.returncode}")
            Path(tmp).chmod(0o644)  # readable by whoever runs a prebuilt one
            os.replace(tmp, lib)
        finally:
            src.unlink(missing_ok=True)
            Path(tmp).unlink(missing_ok=True)
    return _owned(lib)


def _cache_folder() -> Path:
    """The user's cache folder, else one of its own under the temporary folder: either only if
    this user owns it and no one else may write there (a library loaded from it runs as us)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "kvfence" / "native"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return _owned(folder)
    except OSError:
        pass
    folder = Path(tempfile.gettempdir()) / f"kvfence-native-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return _owned(folder)


def _owned(path: Path, root: bool = False) -> Path:
    """`path` if this user (or, with `root`, root) owns it and neither its group nor others may
    write to it."""
    st = path.lstat()
    owners = {os.getuid(), 0} if root else {os.getuid()}
    if st.st_uid not in owners or st.st_mode & 0o022 or path.is_symlink():
        raise OSError(f"{path} is not this user's alone: not used")
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m backend.model.native_build FOLDER", file=sys.stderr)
        return 2
    cc = compiler()
    if cc is None:
        print("no C compiler (gcc or cc) on PATH", file=sys.stderr)
        return 1
    try:
        print(prebuild(Path(argv[0]), cc))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
