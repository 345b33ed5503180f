"""A real PostgreSQL server (Debian's package) in a temporary folder on a free loopback port, for
the control-plane tests: stopped, restarted and restored from a dump on demand. Run as the
`postgres` user when the tests run as root (the server refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.kit.redis_server import free_port

PASSWORD = "kvfence-test-password"


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


BIN = _bin()


def need_postgres() -> None:
    """Skip without PostgreSQL, or fail where it is required (scripts/test installs it)."""
    if BIN is not None:
        return
    if os.environ.get("KVFENCE_REQUIRE_POSTGRES") == "1":
        pytest.fail("KVFENCE_REQUIRE_POSTGRES=1 but PostgreSQL is not installed", pytrace=False)
    pytest.skip("PostgreSQL is not installed (scripts/test installs it with apt-get)")


class PostgresServer:
    """Its own folder under the system's temporary one (a test's tmp_path is root's alone,
    where the `postgres` user cannot enter); `remove()` deletes it."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvfence-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.running = False

    @property
    def url(self) -> str:
        return f"postgresql://kvfence@127.0.0.1:{self.port}/kvfence"

    def _as_owner(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *command], capture_output=True, text=True, check=check,
                              timeout=120)  # fmt: skip

    def init(self) -> None:
        assert BIN is not None
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        pw = self.folder / "pw"
        pw.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(pw, "postgres", "postgres")
        self._as_owner(str(BIN / "initdb"), "-D", str(self.data), "-U", "kvfence",
                       "--auth=scram-sha-256", f"--pwfile={pw}", "-E", "UTF8")  # fmt: skip
        self.start()
        self.psql("postgres", "CREATE DATABASE kvfence")

    def start(self) -> None:
        assert BIN is not None
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_owner(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "log"),
                       "-o", options, "-w", "-t", "60", "start")  # fmt: skip
        self.running = True

    def stop(self) -> None:
        if self.running and BIN is not None:
            self._as_owner(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop",
                           check=False)  # fmt: skip
        self.running = False

    def psql(self, db: str, sql: str) -> str:
        assert BIN is not None
        env = f"PGPASSWORD={PASSWORD}"
        out = self._as_owner("env", env, str(BIN / "psql"), "-h", "127.0.0.1", "-p",
                             str(self.port), "-U", "kvfence", "-d", db, "-v", "ON_ERROR_STOP=1",
                             "-At", "-c", sql)  # fmt: skip
        return out.stdout

    def dump(self) -> str:
        """A backup of the kvfence database (pg_dump's plain SQL)."""
        assert BIN is not None
        out = self._as_owner("env", f"PGPASSWORD={PASSWORD}", str(BIN / "pg_dump"), "-h",
                             "127.0.0.1", "-p", str(self.port), "-U", "kvfence",
                             "kvfence")  # fmt: skip
        return out.stdout

    def restore(self, dump: str) -> None:
        """Replace the kvfence database with `dump` (as an operator restores a backup)."""
        self.psql("postgres", "DROP DATABASE kvfence WITH (FORCE)")
        self.psql("postgres", "CREATE DATABASE kvfence")
        path = self.folder / "restore.sql"
        path.write_text(dump)
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")
        assert BIN is not None
        self._as_owner("env", f"PGPASSWORD={PASSWORD}", str(BIN / "psql"), "-h", "127.0.0.1",
                       "-p", str(self.port), "-U", "kvfence", "-d", "kvfence", "-q",
                       "-v", "ON_ERROR_STOP=1", "-f", str(path))  # fmt: skip

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_until_down(server: PostgresServer, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (server.data / "postmaster.pid").exists():
        time.sleep(0.05)
