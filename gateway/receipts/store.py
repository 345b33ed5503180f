"""Receipt ids and the error of a receipt that cannot be stored (receipts themselves live in the
control-plane database: `gateway.control.receipts`). An id is random and names its expiry hour.

Invariant: ids cannot be guessed; an id names the hour after which its receipt is never served.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Final

HOUR: Final = 3600
_ID_RE: Final = re.compile(r"^rcpt_([0-9a-f]{1,10})_[0-9a-f]{32}$")


class ReceiptWriteError(Exception):
    """A receipt could not be written: the answer fails closed."""


def new_id(keep_s: float, now: float | None = None) -> str:
    """A fresh receipt id, naming the hour after which it is deleted."""
    expiry = int(((time.time() if now is None else now) + keep_s) // HOUR) + 1
    return f"rcpt_{expiry:x}_{secrets.token_hex(16)}"


def expiry_of(receipt_id: str) -> int | None:
    """The expiry hour of a well-formed id (as hours since the epoch), else None."""
    match = _ID_RE.fullmatch(receipt_id)
    return int(match.group(1), 16) if match else None
