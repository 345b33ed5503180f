"""Go's reference implementation of signed notes and transparency-log proofs
(golang.org/x/mod/sumdb/note and sumdb/tlog, Debian's golang-golang-x-mod-dev) built offline into
a tiny verifier (`c2sp_verify/main.go`): an independent check of the log's checkpoints and
proofs. Debian installs the module's source under /usr/share/gocode, read in GOPATH mode."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("c2sp_verify")
GOPATH = Path("/usr/share/gocode")
MODULE = GOPATH / "src/golang.org/x/mod/sumdb/note"


def missing() -> str | None:
    """Why the Go verifier cannot be built here, or None."""
    if shutil.which("go") is None:
        return "no Go toolchain (Debian: golang-go)"
    if not MODULE.is_dir():
        return f"no {MODULE} (Debian: golang-golang-x-mod-dev)"
    return None


def build(out: Path) -> Path:
    """Compile the verifier into `out` (no network: GOPATH mode, Debian's sources)."""
    binary = out / "c2sp_verify"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOFLAGS": ""}
    env.setdefault("GOCACHE", str(out / "gocache"))
    subprocess.run(
        ["go", "build", "-o", str(binary), "."], cwd=SOURCE, env=env, check=True, timeout=300
    )
    return binary
