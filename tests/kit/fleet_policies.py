"""Policy text for a model served by several backends, on top of the gateway tests' policy."""

from __future__ import annotations

from tests.kit.gateway import policy_text


def replica(name: str, url: str, extra: str = "", kind: str = "vllm") -> str:
    return (
        f"  - name: {name}\n    kind: {kind}\n    url: {url}\n    verify: {{canary: false}}\n"
        f'    models: [{{name: smollm2, revision: "1"}}]\n{extra}'
    )


def fleet_policy_text(*backends: str, gateway: str = "") -> str:
    """The gateway tests' policy with its one backend replaced by `backends` (from `replica`)
    and `gateway` added under `gateway:` (indented two spaces)."""
    text = policy_text("http://127.0.0.1:9")
    head, rest = text.split("backends:\n", 1)
    _, tenants = rest.split("tenants:\n", 1)
    tenants = tenants.replace("models: [smollm2, other]", "models: [smollm2]")
    head = head.replace("  access_log: false\n", "  access_log: false\n" + gateway)
    return head + "backends:\n" + "".join(backends) + "tenants:\n" + tenants
