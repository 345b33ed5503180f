"""C2SP signed notes (c2sp.org/signed-note) with Ed25519 keys: the log's note signatures (type
0x01) and witnesses' timestamped cosignatures (type 0x04, c2sp.org/tlog-cosignature), their
verifier keys (`<name>+<key id hex>+<base64(type || public key)>`), signing and opening.

Invariant: `open_note` returns a note's text only when a signature from one of the given keys
verifies, and never when any signature from a given key fails (`NoteError` otherwise).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519: Final = 0x01
COSIGNATURE: Final = 0x04
DASH: Final = "\u2014 "
MAX_SIGNATURES: Final = 64
MAX_NOTE_BYTES: Final = 1 << 16


class NoteError(ValueError):
    """A note, a signature line or a verifier key is malformed, or does not verify."""


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(name: str, kind: int, public: bytes) -> int:
    """SHA-256(name || 0x0A || type || public key)[:4], big-endian (c2sp.org/signed-note)."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()
    return int.from_bytes(digest[:4], "big")


def _check_name(name: str) -> str:
    if not name or any(c.isspace() or c == "+" for c in name) or not name.isprintable():
        raise NoteError(f"key name {name!r} must be non-empty, without spaces or '+'")
    return name


@dataclass(frozen=True, slots=True)
class Verifier:
    """A verifier key: a note signature (ED25519) or a cosignature (COSIGNATURE) key."""

    name: str
    kind: int
    key: Ed25519PublicKey

    @property
    def id(self) -> int:
        return key_id(self.name, self.kind, _raw(self.key))

    @property
    def vkey(self) -> str:
        encoded = base64.b64encode(bytes([self.kind]) + _raw(self.key)).decode()
        return f"{self.name}+{self.id:08x}+{encoded}"

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        name, _, rest = vkey.strip().partition("+")
        hex_id, _, encoded = rest.partition("+")
        try:
            raw = base64.b64decode(encoded, validate=True)
            wanted = int(hex_id, 16)
        except (binascii.Error, ValueError):
            raise NoteError(f"verifier key {vkey!r} is not NAME+HEXID+BASE64") from None
        if len(hex_id) != 8 or len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE):
            raise NoteError(f"verifier key {vkey!r} is not an Ed25519 (0x01 or 0x04) key")
        verifier = cls(_check_name(name), raw[0], Ed25519PublicKey.from_public_bytes(raw[1:]))
        if verifier.id != wanted:
            raise NoteError(f"verifier key {vkey!r}: its key id does not match its name and key")
        return verifier


@dataclass(frozen=True, slots=True)
class Signer:
    name: str
    kind: int
    key: Ed25519PrivateKey

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.kind, self.key.public_key())

    def line(self, text: str, timestamp: int = 0) -> str:
        """The signature line for `text` (a cosignature signs `cosigned_message`)."""
        if self.kind == COSIGNATURE:
            sig = struct.pack(">Q", timestamp) + self.key.sign(cosigned_message(text, timestamp))
        else:
            sig = self.key.sign(text.encode())
        blob = struct.pack(">I", self.verifier.id) + sig
        return f"{DASH}{self.name} {base64.b64encode(blob).decode()}\n"


def cosigned_message(text: str, timestamp: int) -> bytes:
    """What an Ed25519 cosignature signs (c2sp.org/tlog-cosignature)."""
    if not 0 <= timestamp < 2**63:
        raise NoteError("a cosignature's timestamp is out of range")
    return f"cosignature/v1\ntime {timestamp}\n{text}".encode()


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    id: int
    sig: bytes

    @property
    def line(self) -> str:
        blob = struct.pack(">I", self.id) + self.sig
        return f"{DASH}{self.name} {base64.b64encode(blob).decode()}\n"

    def timestamp(self) -> int:
        """A cosignature's time (its first 8 bytes)."""
        return int(struct.unpack(">Q", self.sig[:8])[0]) if len(self.sig) >= 8 else 0


def split_note(note: str) -> tuple[str, list[Signature]]:
    """A note's text (ending in a newline) and its signature lines, parsed but not verified."""
    if len(note.encode()) > MAX_NOTE_BYTES:
        raise NoteError("note is too large")
    if any(c < " " and c != "\n" for c in note):
        raise NoteError("note contains control characters")
    text, sep, sigs = note.rpartition("\n\n")
    if not sep or not sigs.endswith("\n"):
        raise NoteError("malformed note: no blank line before its signature lines")
    signatures = []
    for line in sigs[:-1].split("\n"):
        if not line.startswith(DASH):
            raise NoteError(f"malformed signature line {line[:40]!r}")
        name, _, encoded = line[len(DASH) :].partition(" ")
        try:
            blob = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise NoteError(f"signature by {name} is not base64") from None
        if len(blob) < 5 or not name:
            raise NoteError(f"malformed signature line for {name!r}")
        signatures.append(Signature(name, int.from_bytes(blob[:4], "big"), blob[4:]))
    if len(signatures) > MAX_SIGNATURES:
        raise NoteError("note has too many signatures")
    return text + "\n", signatures


def check_signature(verifier: Verifier, text: str, signature: Signature) -> None:
    """Raise NoteError unless `signature` by `verifier` signs `text`."""
    try:
        if verifier.kind == COSIGNATURE:
            if len(signature.sig) != 72:
                raise NoteError(f"cosignature by {verifier.name} has the wrong length")
            message = cosigned_message(text, signature.timestamp())
            verifier.key.verify(signature.sig[8:], message)
        else:
            verifier.key.verify(signature.sig, text.encode())
    except InvalidSignature:
        what = "cosignature" if verifier.kind == COSIGNATURE else "signature"
        raise NoteError(f"{what} by {verifier.name} does not verify") from None


def open_note(note: str, verifiers: Iterable[Verifier]) -> tuple[str, list[Signature]]:
    """The text of `note` and the signatures that verified, by the given keys only. Raises
    NoteError when none verifies or when one from a given key fails."""
    text, signatures = split_note(note)
    known = {(v.name, v.id): v for v in verifiers}
    good = []
    for signature in signatures:
        verifier = known.get((signature.name, signature.id))
        if verifier is not None:
            check_signature(verifier, text, signature)
            good.append(signature)
    if not good:
        names = ", ".join(sorted({name for name, _ in known})) or "no key"
        raise NoteError(f"the note carries no signature by {names}")
    return text, good


def signed_by(signatures: Sequence[Signature], verifier: Verifier) -> Signature | None:
    return next((s for s in signatures if (s.name, s.id) == (verifier.name, verifier.id)), None)
