"""Key and trust files, and `kvfence keygen`: keys round-trip, permissive or broken files are
refused with a message that names the file."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from kvfence.cli import main as kvfence_main
from kvfence.handle import HandleSigner, HandleVerifier
from kvfence.keys.keyfile import (
    KeyFileError,
    TrustStore,
    add_to_trust_file,
    generate_key,
    load_private_key,
    public_key_text,
    write_private_key,
)


def test_private_key_round_trip_with_mode_0600(tmp_path: Path) -> None:
    key = generate_key()
    path = tmp_path / "k.key"
    write_private_key(path, key)
    assert os.stat(path).st_mode & 0o777 == 0o600
    loaded = load_private_key(path)
    assert public_key_text(loaded.public_key()) == public_key_text(key.public_key())
    with pytest.raises(KeyFileError, match="already exists"):
        write_private_key(path, generate_key())


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_group_or_world_readable_private_key_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "k.key"
    write_private_key(path, generate_key())
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_private_key(path)


def test_bad_private_key_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        load_private_key(tmp_path / "absent.key")
    junk = tmp_path / "junk.key"
    junk.write_text("not a key")
    junk.chmod(0o600)
    with pytest.raises(KeyFileError, match="PKCS8"):
        load_private_key(junk)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", '"keys" list'),
        ("keys: 3", '"keys" list'),
        ("keys: [{id: a}]", "exactly the fields"),
        ("keys: [{id: 'bad id', public_key: AAAA}]", "key id"),
        ("keys: [{id: a, public_key: 'AAAA'}]", "3 bytes"),
        ("keys: [{id: a, public_key: '***'}]", "base64url"),
        ("{keys: [", "not valid JSON or YAML"),
    ],
)
def test_bad_trust_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trust.yaml"
    path.write_text(text)
    with pytest.raises(KeyFileError, match=message) as info:
        TrustStore.from_file(path)
    assert str(path) in str(info.value)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    key = public_key_text(generate_key().public_key())
    path = tmp_path / "trust.json"
    entry = {"id": "a", "public_key": key}
    path.write_bytes(orjson.dumps({"keys": [entry, entry]}))
    with pytest.raises(KeyFileError, match="duplicate"):
        TrustStore.from_file(path)


def test_add_to_trust_file_creates_appends_and_guards_ids(tmp_path: Path) -> None:
    path = tmp_path / "trust.json"
    one, two = generate_key().public_key(), generate_key().public_key()
    assert add_to_trust_file(path, "one", one)
    assert add_to_trust_file(path, "two", two)
    assert not add_to_trust_file(path, "one", one)
    with pytest.raises(KeyFileError, match="another key"):
        add_to_trust_file(path, "one", two)
    assert sorted(TrustStore.from_file(path)) == ["one", "two"]


def test_keygen_writes_a_usable_key_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, trust = tmp_path / "keys", tmp_path / "trust.json"
    assert kvfence_main(["keygen", "--id", "gw-1", "--out", str(out), "--trust", str(trust)]) == 0
    printed = capsys.readouterr().out
    assert os.stat(out / "gw-1.key").st_mode & 0o777 == 0o600
    key = load_private_key(out / "gw-1.key")
    assert public_key_text(key.public_key()) in printed
    assert "PRIVATE" not in printed
    for trust_file in (trust, out / "gw-1.pub"):
        verifier = HandleVerifier(TrustStore.from_file(trust_file), "be-1")
        token = HandleSigner(key, "gw-1").sign("ns", "m", "r", "req", "be-1", body=b"{}")
        assert verifier.verify(token, b"{}").namespace.value == "ns"
    assert kvfence_main(["keygen", "--id", "gw-1", "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
