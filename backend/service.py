"""What every backend request handler shares, built once at start-up.

Invariant: handlers reach the engine only through `Backend.worker`.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.engine.sequence import Segment
from backend.metrics import BackendMetrics
from backend.model.tokenizer import Tokenizer
from backend.openai_api import GenerationRequest
from backend.prompt import special_strings
from backend.public import public_segments
from backend.worker import EngineWorker
from kvfence.attestation import AttestationSigner
from kvfence.handle import HandleVerifier
from kvfence.public import PublicGrant


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    revision: str
    max_positions: int


class Backend:
    """Everything a request handler needs; built once at start-up."""

    def __init__(
        self,
        worker: EngineWorker,
        tokenizer: Tokenizer,
        model: ServedModel,
        verifier: HandleVerifier,
        signer: AttestationSigner,
    ) -> None:
        self.worker = worker
        self.tokenizer = tokenizer
        self.model = model
        self.verifier = verifier
        self.signer = signer
        self.metrics = BackendMetrics()
        self.eos = tuple(tokenizer.eos_ids)
        self.specials = special_strings(tokenizer)

    def public_segments(
        self, req: GenerationRequest, prompt: list[int], grants: tuple[PublicGrant, ...]
    ) -> tuple[Segment, ...]:
        """The prompt's leading blocks that go to the public namespaces `grants` allow."""
        if not grants:
            return ()
        block_size = self.worker.block_size
        return public_segments(self.tokenizer, self.specials, req, prompt, grants, block_size)
