"""Signed notes and cosignatures (C2SP): ours open under the independent `tlog-scales`
implementation of signed-note, tlog-checkpoint and tlog-cosignature."""

from __future__ import annotations

import pytest
from tlog_scales.signing import Vkey
from tlog_scales.tlog import Checkpoint as TheirCheckpoint

from kvfence.keys.keyfile import generate_key
from kvfence.receipts.checkpoint import Checkpoint, ConsistencyProof, FormatError, InclusionProof
from kvfence.receipts.note import (
    COSIGNATURE,
    ED25519,
    NoteError,
    Signer,
    Verifier,
    open_note,
    split_note,
)

LOG = Signer("example.com/log", ED25519, generate_key())
WITNESS = Signer("witness.example/w1", COSIGNATURE, generate_key())
CHECKPOINT = Checkpoint("example.com/log", 20852163, bytes(range(32)))


def signed_and_cosigned() -> str:
    body = CHECKPOINT.body
    return body + "\n" + LOG.line(body) + WITNESS.line(body, 1679315147)


def test_vkeys_round_trip_and_match_the_independent_encoding() -> None:
    for signer in (LOG, WITNESS):
        vkey = signer.verifier.vkey
        assert Verifier.parse(vkey) == signer.verifier
        assert Vkey.from_string(vkey).serialize() == vkey


def test_checkpoint_and_cosignature_open_independently() -> None:
    note = signed_and_cosigned()
    theirs = TheirCheckpoint.from_text(note)
    assert (theirs.origin, theirs.size, theirs.root_hash) == (
        CHECKPOINT.origin,
        CHECKPOINT.size,
        CHECKPOINT.root,
    )
    theirs.verify(Vkey.from_string(LOG.verifier.vkey))
    theirs.verify(Vkey.from_string(WITNESS.verifier.vkey))  # cosignature/v1 over the body


def test_unknown_keys_are_ignored_and_a_bad_known_signature_refused() -> None:
    note = signed_and_cosigned()
    stranger = Signer("example.com/log", ED25519, generate_key()).verifier  # same name, other key
    with pytest.raises(NoteError, match="no signature by"):
        open_note(note, [stranger])
    forged = note.replace("20852163", "20852164", 1)
    with pytest.raises(NoteError, match="does not verify"):
        open_note(forged, [LOG.verifier])
    with pytest.raises(NoteError, match="does not verify"):
        open_note(forged, [WITNESS.verifier])
    with pytest.raises(NoteError):
        split_note("no signatures\n")


def test_proof_formats_round_trip() -> None:
    note = signed_and_cosigned()
    proof = InclusionProof(7, (b"\x01" * 32, b"\x02" * 32), note, b'{"kind":"record"}')
    assert InclusionProof.parse(proof.format()) == proof
    assert proof.format().startswith("c2sp.org/tlog-proof@v1\nextra ")
    bundle = ConsistencyProof(3, (b"\x03" * 32,), note)
    assert ConsistencyProof.parse(bundle.format()) == bundle
    with pytest.raises(FormatError):
        InclusionProof.parse("c2sp.org/tlog-proof@v1\nindex 01\n\n" + note)
    with pytest.raises(FormatError):
        Checkpoint.parse("origin\n12\nnot base64\n")
