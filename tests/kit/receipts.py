"""Receipts in a test or benchmark stack: the key files an operator makes (`kvfence keygen` and
`kvfence witness keygen` write the same), the policy lines that turn receipts and the witnessed
log on, and a tenant's side: fetch a receipt, its proof and the key set, and verify them."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from kvfence.keys.keyfile import generate_key, load_private_key, write_private_key
from kvfence.receipts.check import Report, Root, verify
from kvfence.receipts.note import COSIGNATURE, ED25519, Signer, Verifier
from kvfence.receipts.receipt import KeySet

LOG_NAME = "kvfence.test/log"
WITNESS_NAME = "witness.test/w1"


@dataclass(frozen=True)
class ReceiptKeys:
    folder: Path
    witness: Signer

    @property
    def witness_vkey(self) -> str:
        return self.witness.verifier.vkey

    @property
    def log_key(self) -> Verifier:
        """The gateway's log key, as a tenant gets it out of band (the trust root)."""
        return Signer(LOG_NAME, ED25519, load_private_key(self.folder / "log.key")).verifier

    def gateway_lines(self, *, interval_s: float = 0.2, keep_s: int = 3600) -> str:
        """The policy's `gateway:` lines for the witnessed audit log and receipts."""
        f = self.folder
        return textwrap.indent(
            textwrap.dedent(f"""\
            audit_log:
              path: {f / "log" / "audit.jsonl"}
              key: {{file: {f / "audit.key"}}}
              checkpoints:
                name: {LOG_NAME}
                key: {{file: {f / "log.key"}}}
                interval_s: {interval_s}
                witnesses: ["{self.witness_vkey}"]
            receipts:
              keep_s: {keep_s}
              keys:
                - {{id: r2, private_key: {{file: {f / "r2.key"}}}, active: true}}
                - {{id: r1, private_key: {{file: {f / "r1.key"}}}}}
            """),
            "  ",
        )


def make_receipt_keys(folder: Path) -> ReceiptKeys:
    """Key files (mode 0600) for the log, two receipt keys (r2 active, r1 retired), a witness;
    the audit secret; the log and state folders."""
    for name in ("log", "r1", "r2"):
        write_private_key(folder / f"{name}.key", generate_key())
    (folder / "audit.key").write_text("audit-secret-0123456789abcdef\n")
    (folder / "log").mkdir(mode=0o700)
    (folder / "state").mkdir(mode=0o700)
    return ReceiptKeys(folder, Signer(WITNESS_NAME, COSIGNATURE, generate_key()))


def with_receipts(policy: str, keys: ReceiptKeys, **settings: float) -> str:
    """`policy` (a kit policy text) with receipts on."""
    return policy.replace("gateway:\n", "gateway:\n" + keys.gateway_lines(**settings), 1)  # type: ignore[arg-type]


@dataclass
class Tenant:
    """A tenant's view: its key, and the gateway's receipt endpoints."""

    url: str
    key: str
    session: aiohttp.ClientSession
    log_key: Verifier | None = None  # the trust root it got out of band

    async def get(self, path: str) -> tuple[int, bytes]:
        headers = {"authorization": f"Bearer {self.key}"}
        async with self.session.get(self.url + path, headers=headers) as resp:
            return resp.status, await resp.read()

    async def receipt(self, receipt_id: str) -> bytes:
        status, body = await self.get(f"/v1/kvfence/receipts/{receipt_id}")
        assert status == 200, body
        return body

    async def proof(self, receipt_id: str) -> str:
        status, body = await self.get(f"/v1/kvfence/receipts/{receipt_id}/proof")
        assert status == 200, body
        return body.decode()

    async def keyset(self) -> KeySet:
        status, body = await self.get("/v1/kvfence/keys")
        assert status == 200, body
        import orjson

        return KeySet.parse(orjson.loads(body))

    async def verify(
        self,
        receipt_id: str,
        request: bytes,
        response: bytes,
        witnesses: tuple[Verifier, ...] = (),
    ) -> Report:
        """The tenant's full check from its pinned log key (or, without one, the witnesses):
        signature, both digests, the record in the log, the key set bound to the root."""
        receipt, proof = await self.receipt(receipt_id), await self.proof(receipt_id)
        root = Root(self.log_key, None, witnesses)
        return verify(receipt, None, request=request, response=response, proof=proof, root=root)
