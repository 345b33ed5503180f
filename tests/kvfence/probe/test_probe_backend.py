"""The probe against our real backend serving SmolLM2 on loopback: two credentials in one raw
namespace share (and the control passes), two namespaces are `isolated`, so are two tenants
behind the real gateway, and an endpoint that never shows a hit is `inconclusive`."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.model.load import LoadedModel
from kvfence.probe.cli import probe
from kvfence.probe.client import Endpoint, Identity
from kvfence.probe.method import ProbeConfig
from kvfence.probe.outcome import Outcome
from tests.kit.namespace_proxy import NAMESPACE_HEADER, backend_behind_proxy
from tests.kit.stack import Keys, make_backend, make_keys, running_stack

pytestmark = pytest.mark.slow

# Our backend caches 16-token blocks: 48 letters (about 90 tokens with the marker and the chat
# template) span five. Isolation is claimed against the control's full effect (min_effect 1.0);
# 40 rounds per arm have the power for it down to a control AUC of 0.91, which a loaded machine
# needs (one slow hit in the control costs about 0.06). With usage reported the counter decides:
# the timing control is corroboration, and a loaded host can push it past its 1e-4 level, so
# it is asserted only where timing is the evidence (tests/interop/test_probe_vllm.py).
# A busy host measures a smaller cache effect: up to 100 rounds keep the timing test's power.
QUICK = ProbeConfig(letters=48, partial_letters=16, budget=40, max_budget=100, min_effect=1.0)


def raw(name: str, namespace: str) -> Identity:
    return Identity(name, key=f"key-{name}", headers=((NAMESPACE_HEADER, namespace),))


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path)


async def test_one_namespace_is_shared_with_a_passing_control(
    smollm2: LoadedModel, keys: Keys
) -> None:
    async with backend_behind_proxy(smollm2, keys) as url:
        result = await probe(Endpoint(url, smollm2.name), raw("A", "one"), raw("B", "one"), QUICK)
    assert result.decision.outcome is Outcome.SHARED
    assert result.metadata.control_passed
    assert result.metadata.cross_hits >= 1 and result.rounds == 1


async def test_two_namespaces_are_isolated(smollm2: LoadedModel, keys: Keys) -> None:
    async with backend_behind_proxy(smollm2, keys) as url:
        result = await probe(Endpoint(url, smollm2.name), raw("A", "one"), raw("B", "two"), QUICK)
    assert result.decision.outcome is Outcome.ISOLATED, result.decision.reasons
    assert result.metadata.control_passed
    assert result.rounds == result.schedule.budget >= QUICK.budget
    assert result.metadata.cross_hits == 0


async def test_two_tenants_behind_the_gateway_are_isolated(
    smollm2: LoadedModel, keys: Keys
) -> None:
    async with running_stack(make_backend(smollm2, keys), keys, smollm2.name) as stack:
        a = Identity("A", key=keys.api_keys["acme"])
        b = Identity("B", key=keys.api_keys["globex"])
        result = await probe(Endpoint(stack.url, smollm2.name), a, b, QUICK)
    assert result.decision.outcome is Outcome.ISOLATED, result.decision.reasons
    assert result.metadata.control_passed


async def test_an_endpoint_that_never_hits_is_inconclusive(
    smollm2: LoadedModel, keys: Keys
) -> None:
    """A new namespace for every request and no usage: no cache signal at all."""
    async with backend_behind_proxy(smollm2, keys, fresh=True, strip_usage=True) as url:
        result = await probe(Endpoint(url, smollm2.name), raw("A", "one"), raw("B", "one"), QUICK)
    assert result.decision.outcome is Outcome.INCONCLUSIVE
    assert not result.metadata.available and not result.timing.control_passed
    assert result.rounds == 0
