"""Every tamper kind in tests/kit/tamper.py, tried on a log of two rotated files and an
active one: with the anchor (kept outside the log's folder) `kvfence audit verify` finds every
one; without it, everything but a rollback of file and checkpoint together. The README's one
command checks every file; a wrong key is told apart from tampering."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.audit.chain.format import mac_key
from gateway.audit.chain.verify import AuditVerifyError, WrongKey, verify_chain
from gateway.audit.cli import configure, main
from tests.kit.tamper import ACTIVE, KINDS, ROTATED, SECRET, build

KEY = mac_key(SECRET)


def cli(tmp_path: Path, *argv: str, secret: bytes = SECRET) -> int:
    key = tmp_path / "key"
    key.write_bytes(secret + b"\n")
    parser = argparse.ArgumentParser()
    configure(parser)
    return main(parser.parse_args(["verify", *argv, "--key-file", str(key)]))


@pytest.mark.parametrize("name", sorted(KINDS))
async def test_every_tamper_kind_is_detected_with_the_anchor(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await build(tmp_path)
    assert log.anchor is not None
    assert len(verify_chain(log.active, KEY, log.anchor)) == 3  # intact before
    KINDS[name][0](log)
    with pytest.raises(AuditVerifyError) as info:
        verify_chain(log.active, KEY, log.anchor)
    assert not isinstance(info.value, WrongKey)
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor)) == 1
    assert "FAILED" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(ACTIVE | ROTATED))
async def test_without_the_anchor_only_rollbacks_go_unseen(tmp_path: Path, name: str) -> None:
    """The guarantee docs/threat-model.md states, kind by kind."""
    log = await build(tmp_path, anchor=False)
    tamper, seen_without_anchor = KINDS[name]
    tamper(log)
    try:
        verify_chain(log.active, KEY)
    except WrongKey:
        pytest.fail("tampering reported as a wrong key")
    except AuditVerifyError:
        assert seen_without_anchor, f"{name} is found even without the anchor: update tamper.py"
        return
    assert not seen_without_anchor, f"{name} went unseen without the anchor"


async def test_the_readme_command_checks_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await build(tmp_path)
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor)) == 0
    out = capsys.readouterr().out
    assert "49 records in 3 file(s)" in out and "anchor intact" in out
    KINDS["edit_record_in_oldest_rotation"][0](log)  # no --rotated needed
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor)) == 1
    assert "audit.jsonl.1:3: tag mismatch" in capsys.readouterr().err


async def test_a_wrong_key_is_not_reported_as_tampering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await build(tmp_path)
    other = b"another secret of enough length!"
    assert cli(tmp_path, str(log.active), secret=other) == 3
    assert "WRONG KEY" in capsys.readouterr().err
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor), secret=other) == 3
    KINDS["edit_header_key_check"][0](log)  # an edited key check is tampering, not a key
    assert cli(tmp_path, str(log.active)) == 1


async def test_pruning_on_purpose_is_accepted_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await build(tmp_path)
    log.rotations[0].unlink()
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor)) == 1
    assert "older files were deleted" in capsys.readouterr().err
    assert cli(tmp_path, str(log.active), "--anchor", str(log.anchor), "--allow-pruned") == 0
    assert "pruned" in capsys.readouterr().out
