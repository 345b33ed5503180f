"""No tenant can turn verification into an outage: marker look-alikes echoed back, the same
tokens sent in every form over and over, another tenant's prompts re-sent, and a flood of
answers that trigger rounds leave a healthy backend serving (rounds triggered within their
limits, never a quarantine)."""

from __future__ import annotations

import random
from pathlib import Path

from gateway.verify.markers import MarkerKey
from tests.kit.leak_scenarios import document, leaky_gateway, never, read


async def test_a_tenant_cannot_quarantine_a_healthy_backend(tmp_path: Path) -> None:
    rng = random.Random(11)
    forged = MarkerKey(b"not the gateway's key" * 2)
    async with leaky_gateway(tmp_path, never, {"echo": True}) as (gw, _):
        verdicts: dict[str, int] = {}
        sent = 0
        for i in range(30):
            doc = document(rng, 120)
            look_alikes = f"kvfc{'0' * 20} {forged.mint()} kvfc{rng.getrandbits(80):020x}"
            bodies = [
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
                    {"type": "text", "text": doc}, {"type": "text", "text": look_alikes}]}]}),
                ("/v1/chat/completions", {"messages": [
                    {"role": "user", "content": doc + "\n" + look_alikes}]}),
                ("/v1/responses", {"input": doc + "\n" + look_alikes}),
                ("/v1/completions", {"prompt": " ".join(map(str, range(i, i + 150)))}),
                ("/v1/completions", {"prompt": list(range(i, i + 150))}),  # ids: unexplained
            ]  # fmt: skip
            for tenant in ("acme", "globex"):  # B re-sends everything A sent
                for path, body in bodies:
                    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
                    body = {"model": "smollm2", limit: 2, **body}
                    status, verdict, _, _ = await read(await gw.post(tenant, path, body))
                    assert status == 200, (path, verdict)
                    verdicts[verdict] = verdicts.get(verdict, 0) + 1
                    sent += 1
            assert not gw.health().quarantined
        await gw.round()  # and a scheduled one
        health = gw.health()
        _, status = await gw.admin("GET", "/status")
    assert sent == 300 and "violation" not in verdicts, verdicts
    assert not health.quarantined and health.violations == {}
    assert 1 <= health.triggered <= 4  # one per tenant a minute, the rest limited
    assert set(health.canary_shapes) >= {"completions/plain/1m/192t"}
