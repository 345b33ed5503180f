"""The verdict: the audit's outcome for one response, the one type the whole project shares.

Invariant: `clean` means our backend attested that the answer used nothing but the request's
own namespace; `verified` means an external server passed its last canary round and the
answer's reported cache hit is explained by the namespace's own history. Under `enforce`,
`violation`, `mismatch`, `missing` and `invalid` are withheld.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

VERDICT_HEADER: Final = "x-kvfence-verdict"  # on every answer the gateway gives


class Verdict(StrEnum):
    CLEAN = "clean"  # attested: only the request's own namespace was used
    VIOLATION = "violation"  # attested: a block of another namespace was used
    MISMATCH = "mismatch"  # attested, but for another request id or namespace
    MISSING = "missing"  # a kvfence backend sent no attestation
    INVALID = "invalid"  # malformed, unknown key, bad signature or another backend's
    UNATTESTED = "unattested"  # nothing to attest: an error answer, or an unscoped backend
    # External servers (vLLM, SGLang, TensorRT-LLM, Dynamo), which cannot attest:
    VERIFIED = "verified"  # last canary isolated, and any reported hit explained
    UNVERIFIED = "unverified"  # no canary round yet, or the last was inconclusive or stale
    UNEXPLAINED = "unexplained"  # a reported hit the history cannot explain, not yet provable
