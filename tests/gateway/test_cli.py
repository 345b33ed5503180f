"""`kvfence keys new` and `kvfence gateway` as a person runs them."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from kvfence.cli import main as kvfence_main
from kvfence.keys.apikey import is_well_formed, key_digest
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, policy_text

PEPPER = "cli-pepper-0123456789"


def test_keys_new_prints_key_and_digest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVFENCE_PEPPER", PEPPER)
    assert kvfence_main(["keys", "new", "--tenant", "acme", "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["tenant"] == "acme" and is_well_formed(out["api_key"])
    assert out["digest"] == key_digest(PEPPER.encode(), out["api_key"])
    assert kvfence_main(["keys", "new", "--tenant", "acme"]) == 0
    text = capsys.readouterr().out
    assert "kvf_" in text and "hmac-sha256:" in text


def test_keys_new_pepper_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pepper").write_text(PEPPER + "\n")
    assert (
        kvfence_main(
            ["keys", "new", "--tenant", "a", "--json", "--pepper-file", str(tmp_path / "pepper")]
        )
        == 0
    )
    out = orjson.loads(capsys.readouterr().out)
    assert out["digest"] == key_digest(PEPPER.encode(), out["api_key"])
    monkeypatch.setenv("PEPPER", PEPPER)
    (tmp_path / "p.yaml").write_text(policy_text("http://127.0.0.1:9"))
    assert (
        kvfence_main(
            ["keys", "new", "--tenant", "acme", "--json", "--policy", str(tmp_path / "p.yaml")]
        )
        == 0
    )
    out = orjson.loads(capsys.readouterr().out)
    assert out["digest"] == key_digest(PEPPER.encode(), out["api_key"])
    monkeypatch.setenv("SHORT", "abc")
    assert kvfence_main(["keys", "new", "--tenant", "a", "--pepper-env", "SHORT"]) == 2
    assert "at least 16 bytes" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_gateway_refuses_without_c_parser(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(policy_text("http://127.0.0.1:9"))
    env = {**os.environ, **ENV, "AIOHTTP_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "kvfence.cli", "gateway", "--policy", str(tmp_path / "p.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "C HTTP parser" in out.stderr


async def test_gateway_workers_share_the_port(tmp_path: Path, upstream: FakeUpstream) -> None:
    (tmp_path / "audit.key").write_text("k" * 32)
    audit = "access_log: true\n  audit_log: {path: audit.jsonl, key: {file: audit.key}}"
    (tmp_path / "p.yaml").write_text(policy_text(upstream.url).replace("access_log: false", audit))
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvfence.cli",
        "gateway",
        "--policy",
        str(tmp_path / "p.yaml"),
        "--port",
        str(port),
        "--workers",
        "2",
        env={**os.environ, **ENV},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    assert proc.stderr is not None
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while sum(b'"msg":"serving"' in line for line in seen) < 2:
                line = await proc.stderr.readline()
                assert line, b"".join(seen).decode()  # the gateway exited: show why
                seen.append(line)
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                resp = await session.post(
                    url + "/v1/chat/completions",
                    json={"model": "smollm2", "messages": []},
                    headers={"authorization": f"Bearer {KEYS['acme']}"},
                )
                assert resp.status == 200
        assert upstream.received[-1].json["cache_salt"].startswith("ns1.")
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
        logs = b"".join(seen).decode() + (await proc.stderr.read()).decode()
    assert logs.count('"msg":"serving"') == 2
    assert '"tenant":"acme"' in logs and KEYS["acme"] not in logs
    _check_worker_chains(tmp_path)


def _check_worker_chains(tmp_path: Path) -> None:
    """Each worker keeps its own audit chain; together they hold one record per response."""
    assert not (tmp_path / "audit.jsonl").exists()
    chains = sorted(tmp_path.glob("audit.w*.jsonl"))
    assert chains and {p.name for p in chains} <= {"audit.w1.jsonl", "audit.w2.jsonl"}
    records = [line for p in chains for line in p.read_text().splitlines() if '"record"' in line]
    assert len(records) == 4
    key = str(tmp_path / "audit.key")
    for chain in chains:
        assert kvfence_main(["audit", "verify", str(chain), "--key-file", key]) == 0


def test_keys_new_reads_a_policy_pepper_file_beside_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "pepper").write_text(PEPPER + "\n")
    text = policy_text("http://127.0.0.1:9").replace("{env: PEPPER}", "{file: pepper}")
    (tmp_path / "conf" / "p.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)  # the file is found beside the policy, not in the cwd
    args = ["keys", "new", "--tenant", "acme", "--json", "--policy", "conf/p.yaml"]
    assert kvfence_main(args) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["digest"] == key_digest(PEPPER.encode(), out["api_key"])


@pytest.mark.parametrize("tenant", ["acme corp", "", "x" * 65, "acme/../b", "émile"])
def test_keys_new_refuses_a_tenant_id_the_policy_would_refuse(
    tenant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVFENCE_PEPPER", PEPPER)
    assert kvfence_main(["keys", "new", "--tenant", tenant]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # no key minted
    assert out.err.count("\n") == 1
    assert "is not valid: use 1 to 64 of A-Z a-z 0-9 . _ - (no spaces)" in out.err


def test_keys_new_refuses_a_tenant_absent_from_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PEPPER", PEPPER)
    (tmp_path / "p.yaml").write_text(policy_text("http://127.0.0.1:9"))
    args = ["keys", "new", "--tenant", "acmee", "--policy", str(tmp_path / "p.yaml")]
    assert kvfence_main(args) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "tenant 'acmee' is not in" in out.err
    assert "(its tenants: acme, globex, initech, umbrella)" in out.err


def test_keys_new_appends_the_digest_to_the_tenants_digest_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a policy's `api_keys: [{file: ...}]` reads: one digest a line, nothing pasted."""
    monkeypatch.setenv("KVFENCE_PEPPER", PEPPER)
    digests = tmp_path / "acme.digests"
    keys = []
    for _ in range(2):
        args = ["keys", "new", "--tenant", "acme", "--json", "--digest-file", str(digests)]
        assert kvfence_main(args) == 0
        keys.append(orjson.loads(capsys.readouterr().out)["api_key"])
    assert digests.read_text().splitlines() == [key_digest(PEPPER.encode(), k) for k in keys]
    assert oct(digests.stat().st_mode & 0o777) == "0o600"


def test_keys_new_writes_the_key_to_a_new_file_and_never_overwrites_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a script captures with `KEY=$(cat FILE)`: the key only in a file only its owner
    reads, never on the terminal; a second key for the same file is refused, nothing recorded."""
    monkeypatch.setenv("KVFENCE_PEPPER", PEPPER)
    digests, key_file = tmp_path / "acme.digests", tmp_path / "acme.key"
    args = ["keys", "new", "--tenant", "acme", "--digest-file", str(digests)]
    assert kvfence_main([*args, "--key-file", str(key_file)]) == 0
    out = capsys.readouterr().out
    key = key_file.read_text().removesuffix("\n")
    assert is_well_formed(key) and key not in out and str(key_file) in out
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert digests.read_text().splitlines() == [key_digest(PEPPER.encode(), key)]

    assert kvfence_main([*args, "--key-file", str(key_file)]) == 2
    assert f"{key_file} already exists" in capsys.readouterr().err
    assert key_file.read_text() == key + "\n"
    assert len(digests.read_text().splitlines()) == 1

    # A digest that cannot be recorded takes its key file with it.
    lost = tmp_path / "globex.key"
    bad = ["--digest-file", str(tmp_path / "no-such-dir" / "d"), "--key-file", str(lost)]
    assert kvfence_main(["keys", "new", "--tenant", "globex", *bad]) == 2
    assert "cannot append to" in capsys.readouterr().err
    assert not lost.exists()
