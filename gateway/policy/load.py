"""Load and validate a policy file into a `Policy`; the only producer of `Policy` objects.

Invariant: either every check passes and a frozen `Policy` is returned, or `PolicyError` lists
every problem found, each with file, line and key path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from gateway.policy.backends import named_models, read_backends
from gateway.policy.keys import read_audit_log, read_handle_key, read_handle_ttl
from gateway.policy.model import (
    AdminSettings,
    ClientInputMode,
    ClientLimits,
    GatewaySettings,
    HistorySettings,
    Listen,
    NamespaceKeySpec,
    Policy,
    PublicSettings,
    Timeouts,
    UnknownFieldMode,
)
from gateway.policy.node import Bail, Node, PolicyError, compose, guarded
from gateway.policy.public import read_public
from gateway.policy.secrets import resolve
from gateway.policy.tenants import read_tenants
from gateway.policy.verify import read_admin, read_history
from kvfence.apikey import MIN_PEPPER_BYTES
from kvfence.namespace import KEY_ID_RE, MIN_SECRET_BYTES

_F = frozenset
_TOP = _F({"version", "gateway", "backends", "tenants"})
_TOP_OPT = _F({"public"})
_GATEWAY_REQ = _F({"namespace_keys", "api_key_pepper"})
_GATEWAY_OPT = _F(
    {"listen", "client_inputs", "timeouts", "limits", "access_log", "handle_key", "handle_ttl_s"}
    | {"audit_log", "unknown_fields", "admin", "state_dir", "history"}
)
T = TypeVar("T")
_HOST_RE = re.compile(r"^[A-Za-z0-9.:_-]+$")


def _listen(node: Node) -> Listen:
    f = node.mapping(_F(), _F({"host", "port"}))
    return Listen(
        host=f["host"].text(_HOST_RE) if "host" in f else "127.0.0.1",
        port=f["port"].integer(0, 65535) if "port" in f else 8080,
    )


def _keys(node: Node, env: Mapping[str, str], base: Path) -> tuple[NamespaceKeySpec, ...]:
    keys: list[NamespaceKeySpec] = []
    for item in node.items():

        def one(item: Node = item) -> NamespaceKeySpec:
            f = item.mapping(_F({"id", "secret"}), _F({"active"}))
            key_id = f["id"].text(KEY_ID_RE, "of [A-Za-z0-9_-], at most 32")
            if any(k.id == key_id for k in keys):
                f["id"].fail(f"duplicate namespace key id {key_id}")
            active = f["active"].boolean() if "active" in f else False
            return NamespaceKeySpec(
                key_id, resolve(f["secret"], env, base, MIN_SECRET_BYTES), active
            )

        key = guarded(one)
        if key is not None:
            keys.append(key)
    if len(keys) == len(node.items()) and sum(k.active for k in keys) != 1:
        node.fail("exactly one namespace key must be active: true")
    return tuple(keys)


def _timeouts(node: Node) -> Timeouts:
    f = node.mapping(_F(), _F({"connect_s", "first_byte_s", "idle_s"}))
    d = Timeouts()
    return Timeouts(*(f[k].positive() if k in f else getattr(d, k) for k in Timeouts.__slots__))


def _limits(node: Node) -> ClientLimits:
    f = node.mapping(_F(), _F(ClientLimits.__slots__))
    d = ClientLimits()
    return ClientLimits(
        header_timeout_s=f["header_timeout_s"].positive()
        if "header_timeout_s" in f
        else d.header_timeout_s,
        body_timeout_s=f["body_timeout_s"].positive()
        if "body_timeout_s" in f
        else d.body_timeout_s,
        max_body_bytes=f["max_body_bytes"].integer(1024, 1 << 31)
        if "max_body_bytes" in f
        else d.max_body_bytes,
        max_connections=f["max_connections"].integer(1, 1 << 20)
        if "max_connections" in f
        else d.max_connections,
        max_connections_per_client=f["max_connections_per_client"].integer(1, 1 << 20)
        if "max_connections_per_client" in f
        else d.max_connections_per_client,
        max_in_flight=f["max_in_flight"].integer(1, 1 << 20)
        if "max_in_flight" in f
        else d.max_in_flight,
        write_timeout_s=f["write_timeout_s"].positive()
        if "write_timeout_s" in f
        else d.write_timeout_s,
        max_answer_bytes=f["max_answer_bytes"].integer(1024, 1 << 34)
        if "max_answer_bytes" in f
        else d.max_answer_bytes,
    )


def _gateway(node: Node, env: Mapping[str, str], base: Path) -> GatewaySettings:
    f = node.mapping(_GATEWAY_REQ, _GATEWAY_OPT)

    def opt(key: str, read: Callable[[Node], T], default: T) -> T | None:
        return guarded(lambda: read(f[key])) if key in f else default

    keys = guarded(lambda: _keys(f["namespace_keys"], env, base))
    pepper = guarded(lambda: resolve(f["api_key_pepper"], env, base, MIN_PEPPER_BYTES))
    listen = opt("listen", _listen, Listen())
    mode = opt("client_inputs", _client_inputs, ClientInputMode.STRIP)
    unknown = opt("unknown_fields", _unknown_fields, UnknownFieldMode.DROP)
    timeouts = opt("timeouts", _timeouts, Timeouts())
    limits = opt("limits", _limits, ClientLimits())
    access_log = opt("access_log", Node.boolean, True)
    handle_key = opt("handle_key", lambda n: read_handle_key(n, base), None)
    handle_ttl = opt("handle_ttl_s", read_handle_ttl, 60.0)
    audit_log = opt("audit_log", lambda n: read_audit_log(n, env, base), None)
    admin = opt("admin", lambda n: read_admin(n, env, base), AdminSettings())
    state_dir = opt("state_dir", lambda n: base / n.text(), None)
    history = opt("history", read_history, HistorySettings())
    read = (("handle_key", handle_key), ("audit_log", audit_log), ("state_dir", state_dir))
    unread = [k for k, v in read if k in f and v is None]
    required = (keys, pepper, listen, mode, unknown, timeouts, limits, access_log, handle_ttl)
    if unread or None in required or admin is None or history is None:
        raise Bail()
    assert keys is not None and pepper is not None and listen is not None
    assert mode is not None and unknown is not None and timeouts is not None
    assert limits is not None and access_log is not None and handle_ttl is not None
    return GatewaySettings(
        namespace_keys=keys,
        api_key_pepper=pepper,
        listen=listen,
        client_inputs=mode,
        unknown_fields=unknown,
        timeouts=timeouts,
        limits=limits,
        access_log=access_log,
        handle_key=handle_key,
        handle_ttl_s=handle_ttl,
        audit_log=audit_log,
        admin=admin,
        state_dir=state_dir,
        history=history,
    )


def _client_inputs(node: Node) -> ClientInputMode:
    return ClientInputMode(node.choice(("strip", "reject")))


def _unknown_fields(node: Node) -> UnknownFieldMode:
    return UnknownFieldMode(node.choice(("drop", "reject")))


def parse_policy(
    text: str,
    source: str = "<policy>",
    env: Mapping[str, str] | None = None,
    base: Path | None = None,
) -> Policy:
    """Validate policy text. `env` defaults to os.environ; `{file: ...}` is relative to `base`."""
    env = os.environ if env is None else env
    base = Path(".") if base is None else base
    root = compose(text, source)
    errors = root.errors
    fields = guarded(lambda: root.mapping(_TOP, _TOP_OPT))
    if fields is None:
        raise PolicyError(errors.lines)
    version = guarded(lambda: fields["version"].exactly(1))
    settings = guarded(lambda: _gateway(fields["gateway"], env, base))
    backends = read_backends(fields["backends"], env, base)
    served = {m.name for b in backends for m in b.models}
    unread = named_models(fields["backends"]) - served
    tenants = read_tenants(fields["tenants"], served, base, unread)
    public = PublicSettings()
    if "public" in fields:
        public = guarded(lambda: read_public(fields["public"], served | unread, base)) or public
    if errors.lines or version is None or settings is None:
        raise PolicyError(errors.lines)
    return Policy(source, version, settings, backends, tenants, public)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (blocking: call it off the event loop when serving).
    Any content is either a `Policy` or a `PolicyError`: bytes that are not UTF-8 name the
    line of the first bad byte."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError([f"{path}:0: (file): cannot read: {exc.strerror}"]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PolicyError(
            [f"{path}:{line}: (file): not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})"]
        ) from None
    return parse_policy(text, str(path), base=path.parent)
