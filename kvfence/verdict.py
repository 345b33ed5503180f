"""The verdict: the audit's outcome for one response, the one type both sides and the audit log
share. Invariant: only `clean` means our backend attested that the answer used nothing but the
request's own namespace; every other value is recorded, and under `enforce` withheld.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    CLEAN = "clean"  # attested: only the request's own namespace was used
    VIOLATION = "violation"  # attested: a block of another namespace was used
    MISMATCH = "mismatch"  # attested, but for another request id or namespace
    MISSING = "missing"  # a kvfence backend sent no attestation
    INVALID = "invalid"  # malformed, unknown key, bad signature or another backend's
    UNATTESTED = "unattested"  # a backend kind that does not attest (or an error answer)
