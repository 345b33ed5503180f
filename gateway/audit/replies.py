"""What an exchange hands its relay to act on: a plain answer to send, a stream to open, the
local answer that replaces a withheld one, or the error that cuts a stream (or ends one whose
receipt could not be stored).

Invariant: plain values: no relay reads an exchange's attributes back, and none of these holds
a request or a response object.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.audit.judge import Judgement
from gateway.errors import AttestationRefused, ReceiptUnavailable
from gateway.receipts.draft import Draft
from kvfence.receipts.receipt import RECEIPT_HEADER
from kvfence.verdict import VERDICT_HEADER


@dataclass(frozen=True, slots=True)
class Plain:
    """A plain answer as the client gets it: the backend's status and content type, with
    `headers` beside them."""

    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Opened:
    """A stream that goes on: its head carries `headers`; `first` is sent first (its first
    event without its attestation; empty when there is none)."""

    headers: dict[str, str]
    first: bytes


@dataclass(frozen=True, slots=True)
class Withheld:
    """The local answer that replaces a withheld one: `error`, with `headers` beside it."""

    error: AttestationRefused
    request_id: str
    headers: dict[str, str]


def headers(request_id: str, judgement: Judgement, receipt: Draft | None) -> dict[str, str]:
    """What an answer the backend gave carries beside the backend's headers."""
    out = {"x-request-id": request_id, VERDICT_HEADER: judgement.verdict.value}
    if receipt is not None:
        out[RECEIPT_HEADER] = receipt.receipt_id
    return out


def withheld(judgement: Judgement, request_id: str, receipt: Draft | None) -> Withheld:
    """The refusal that replaces an answer its `judgement` blocks."""
    what = f"the response was withheld: its audit verdict is {judgement.verdict.value}"
    headers = {VERDICT_HEADER: judgement.verdict.value}
    if receipt is not None:
        headers[RECEIPT_HEADER] = receipt.receipt_id
    return Withheld(AttestationRefused(what), request_id, headers)


def cut(judgement: Judgement) -> AttestationRefused:
    """The error that ends a stream its `judgement` withholds the rest of."""
    what = f"its audit verdict is {judgement.verdict.value}"
    return AttestationRefused(f"the rest of the answer was withheld: {what}")


def unstored(receipt_id: str, reason: str | None) -> ReceiptUnavailable:
    """The error that ends a stream whose head named `receipt_id` when that receipt could not
    be stored; `reason`: the error the stream was already ending with, if any."""
    what = f"receipt {receipt_id} ({RECEIPT_HEADER}) could not be stored: this answer has none"
    return ReceiptUnavailable(what if reason is None else f"{what} (it ended early: {reason})")
