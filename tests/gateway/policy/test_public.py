"""The policy's public prefixes and a tenant's `public` settings: parsed once into frozen
objects, and every broken entry a load error that names its line and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.load import parse_policy
from gateway.policy.tenant_model import Scope
from tests.gateway.policy.test_load import errors_of
from tests.kit.gateway import ENV, policy_text

URL = "http://127.0.0.1:9"
SYSTEM = "You are a helpful assistant for the Acme support desk."


def with_public(section: str, tenant_old: str = "", tenant_new: str = "") -> str:
    text = policy_text(URL, extra=section)
    if tenant_old:
        assert tenant_old in text
        text = text.replace(tenant_old, tenant_new, 1)
    return text


def test_declared_prefixes_text_file_and_messages(tmp_path: Path) -> None:
    (tmp_path / "tools.txt").write_text("Tools: search, calculator.\n")
    section = f"""\
public:
  cache: {{ceiling: 0.3, floor: 0.1}}
  prefixes:
    - {{name: support, model: smollm2, text: "{SYSTEM}"}}
    - {{name: tools, model: smollm2, file: tools.txt}}
    - name: chat-head
      model: other
      messages:
        - {{role: developer, text: "Be brief."}}
        - {{role: user, text: "Hello"}}
"""
    policy = parse_policy(with_public(section), "p.yaml", env=ENV, base=tmp_path)
    support, tools, head = policy.public.prefixes
    assert (support.messages, support.text) == ((("system", SYSTEM),), SYSTEM)
    assert tools.text == "Tools: search, calculator."  # the file's trailing newline is not kept
    assert head.messages == (("system", "Be brief."), ("user", "Hello")) and head.text is None
    assert (policy.public.ceiling, policy.public.floor) == (0.3, 0.1)


def test_no_public_section_means_nothing_public() -> None:
    policy = parse_policy(policy_text(URL), "p.yaml", env=ENV)
    assert policy.public.prefixes == ()
    assert all(t.public.declared and not t.public.own for t in policy.tenants)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "public:\n  prefixes:\n    - {name: a, model: nope, text: x}\n",
            "public.prefixes[0].model: no backend serves model nope",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2}\n",
            "public.prefixes[0]: needs exactly one of text or file",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, text: x, file: y.txt}\n",
            "public.prefixes[0]: needs exactly one of text or file",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, file: missing.txt}\n",
            "public.prefixes[0].file: cannot read missing.txt",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, text: ''}\n",
            "public.prefixes[0].text: must be a non-empty string",
        ),
        (
            "public:\n  prefixes:\n    - {name: 'a b', model: smollm2, text: x}\n",
            "public.prefixes[0].name:",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, text: x}\n"
            "    - {name: a, model: smollm2, text: y}\n",
            "duplicate public prefix name a",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, messages: []}\n",
            "public.prefixes[0].messages: must list at least one message",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, text: x,"
            " messages: [{role: user, text: y}]}\n",
            "public.prefixes[0]: give messages, or one text or file, not both",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2,"
            " messages: [{role: tool, text: y}]}\n",
            "public.prefixes[0].messages[0].role: must be one of",
        ),
        (
            "public:\n  cache: {ceiling: 0.1, floor: 0.2}\n",
            "public.cache.floor: must not exceed the ceiling",
        ),
        (
            "public:\n  prefixes:\n    - {name: a, model: smollm2, text: x, share: all}\n",
            "public.prefixes[0].share: unknown key",
        ),
    ],
)
def test_a_broken_public_entry_is_a_load_error(section: str, expected: str, tmp_path: Path) -> None:
    errors = errors_of(with_public(section), base=tmp_path)
    assert any(expected in e for e in errors), errors


def test_tenant_opt_in_to_mark_its_own_messages_public() -> None:
    old = "scope: session,"
    policy = parse_policy(
        with_public("", old, "scope: session, public: {own: true},"), "p.yaml", env=ENV
    )
    umbrella = next(t for t in policy.tenants if t.id == "umbrella")
    assert umbrella.public.own and umbrella.public.declared


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        ("scope: request, public: {own: true},", "tenants[3].public: scope request reuses nothing"),
        ("scope: request, public: {declared: true},", "scope request reuses nothing"),
        ("scope: session, public: {own: yes-please},", "tenants[3].public.own:"),
        ("scope: session, public: {others: true},", "tenants[3].public.others: unknown key"),
        ("scope: request, scope_header: x-req,", "scope request takes no scope header"),
    ],
)
def test_broken_tenant_public_settings(new: str, expected: str) -> None:
    errors = errors_of(with_public("", "scope: session,", new))
    assert any(expected in e for e in errors), errors


def test_scope_request_uses_no_public_prefix_by_default() -> None:
    policy = parse_policy(with_public("", "scope: session,", "scope: request,"), "p.yaml", env=ENV)
    umbrella = next(t for t in policy.tenants if t.id == "umbrella")
    assert umbrella.scope is Scope.REQUEST
    assert not umbrella.public.declared and not umbrella.public.own
