"""The policy's fleet settings: several backends per model, weights, routing and shared state,
and the errors an operator sees for a fleet that cannot work."""

from __future__ import annotations

import pytest

from gateway.policy.load import parse_policy
from gateway.policy.model import OnSharedFailure, RoutingStrategy
from gateway.policy.node import PolicyError
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml", env=ENV)
    return info.value.errors


def test_two_backends_of_one_model_with_weights_and_fleet_settings() -> None:
    gateway = (
        "  routing: {strategy: round_robin, retries: 2, eject_after_errors: 5, eject_for_s: 9}\n"
        "  shared: {redis: {url: 'redis://redis:6379/0', password: {env: NS_KEY}},"
        " on_failure: local}\n"
    )
    text = fleet_policy_text(replica("a", A, "    weight: 3\n"), replica("b", B), gateway=gateway)
    policy = parse_policy(text, "policy.yaml", env=ENV)
    assert [(b.name, b.weight) for b in policy.backends] == [("a", 3.0), ("b", 1.0)]
    routing, shared = policy.gateway.routing, policy.gateway.shared
    assert routing.strategy is RoutingStrategy.ROUND_ROBIN and routing.retries == 2
    assert (routing.eject_after_errors, routing.eject_for_s) == (5, 9.0)
    assert shared is not None and shared.redis_url == "redis://redis:6379/0"
    assert shared.on_failure is OnSharedFailure.LOCAL
    assert shared.password is not None and ENV["NS_KEY"] not in repr(policy)


def test_defaults_keep_one_machine_as_it_was() -> None:
    policy = parse_policy(fleet_policy_text(replica("a", A)), "policy.yaml", env=ENV)
    assert policy.gateway.shared is None
    assert policy.gateway.routing.strategy is RoutingStrategy.AFFINITY
    assert policy.backends[0].weight == 1.0


def test_a_scoped_and_an_unscoped_backend_of_one_model_are_refused() -> None:
    unscoped = replica("b", B, kind="llamacpp").replace(
        "    verify: {canary: false}\n", "    allow_unscoped: true\n"
    )
    errors = errors_of(fleet_policy_text(replica("a", A), unscoped))
    assert len(errors) == 1
    assert "served by both a scoped and an unscoped backend" in errors[0]
    assert "backends[1].models[0].name" in errors[0]


def test_compatible_scoped_kinds_may_serve_one_model() -> None:
    text = fleet_policy_text(replica("a", A), replica("b", B, kind="sglang"))
    assert {b.kind for b in parse_policy(text, "policy.yaml", env=ENV).backends} == {
        "vllm",
        "sglang",
    }


def test_backends_of_one_model_must_agree_on_its_revision() -> None:
    other = replica("b", B).replace('revision: "1"', 'revision: "2"')
    (error,) = errors_of(fleet_policy_text(replica("a", A), other))
    assert "served elsewhere with another revision" in error


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [
        ("  routing: {strategy: random}\n", "must be one of affinity, round_robin"),
        ("  routing: {retries: 20}\n", "must be between 0 and 8"),
        ("  shared: {redis: {url: 'redis://u:secret@h:6379'}}\n", "a password goes in password"),
        ("  shared: {redis: {url: 'redis://h:6379'}, on_failure: open}\n", "closed, local"),
        ("  shared: {on_failure: local}\n", "redis"),
        ("  shared: {redis: {url: 'redis://h:6379', username: gw}}\n", "needs its password"),
        ("  shared: {redis: {url: 'redis://h:6379', ca_file: ca.pem}}\n", "needs a rediss://"),
        ("  shared: {redis: {url: 'rediss://h:6379', ca_file: no.pem}}\n", "not a file"),
    ],
)
def test_fleet_settings_errors_name_the_key(gateway: str, expected: str) -> None:
    (error,) = errors_of(fleet_policy_text(replica("a", A), gateway=gateway))
    assert expected in error and "gateway." in error


def test_a_weight_must_be_positive() -> None:
    (error,) = errors_of(fleet_policy_text(replica("a", A, "    weight: 0\n")))
    assert "backends[0].weight" in error
