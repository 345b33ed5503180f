"""Load and validate a policy file into a `Policy`; the only producer of `Policy` objects.

Invariant: either every check passes and a frozen `Policy` is returned, or `PolicyError` lists
every problem found, each with file, line and key path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from gateway.policy.backends import named_models, read_backends
from gateway.policy.fleet import read_control, read_routing, read_shared, read_tracing
from gateway.policy.keys import read_audit_log, read_handle_key, read_handle_ttl
from gateway.policy.model import (
    ClientInputMode,
    ClientLimits,
    ControlDatabase,
    GatewaySettings,
    Listen,
    NamespaceKeySpec,
    Policy,
    RegistrySettings,
    RegistryStore,
    Timeouts,
    UnknownFieldMode,
)
from gateway.policy.node import Bail, Node, PolicyError, compose, guarded, optional
from gateway.policy.public import read_public
from gateway.policy.receipts import read_receipts
from gateway.policy.secrets import resolve
from gateway.policy.sources import recording
from gateway.policy.tenant_model import PublicSettings
from gateway.policy.tenants import read_tenants
from gateway.policy.verify import read_admin, read_history
from kvfence.keys.apikey import MIN_PEPPER_BYTES
from kvfence.namespace import KEY_ID_RE, MIN_SECRET_BYTES

_F = frozenset
_TOP = _F({"version", "gateway", "backends", "tenants"})
_TOP_OPT = _F({"public", "registry"})
_GATEWAY_REQ = _F({"namespace_keys", "api_key_pepper"})
_GATEWAY_OPT = _F(
    {"listen", "client_inputs", "timeouts", "limits", "access_log", "handle_key", "handle_ttl_s"}
    | {"audit_log", "unknown_fields", "admin", "state_dir", "history", "routing", "shared"}
    | {"receipts", "tracing", "control"}
)
T = TypeVar("T")
_HOST_RE = re.compile(r"^[A-Za-z0-9.:_-]+$")


def _listen(node: Node) -> Listen:
    f = node.mapping(_F(), _F({"host", "port"}))
    return Listen(
        **optional(f, host=lambda n: n.text(_HOST_RE), port=lambda n: n.integer(0, 65535))
    )


def _keys(node: Node, env: Mapping[str, str], base: Path) -> tuple[NamespaceKeySpec, ...]:
    keys: list[NamespaceKeySpec] = []
    for item in node.items():

        def one(item: Node = item) -> NamespaceKeySpec:
            f = item.mapping(_F({"id", "secret"}), _F({"active"}))
            key_id = f["id"].text(KEY_ID_RE, "of [A-Za-z0-9_-], at most 32")
            if any(k.id == key_id for k in keys):
                f["id"].fail(f"duplicate namespace key id {key_id}")
            secret = resolve(f["secret"], env, base, MIN_SECRET_BYTES)
            return NamespaceKeySpec(key_id, secret, **optional(f, active=Node.boolean))

        key = guarded(one)
        if key is not None:
            keys.append(key)
    if len(keys) == len(node.items()) and sum(k.active for k in keys) != 1:
        node.fail("exactly one namespace key must be active: true")
    return tuple(keys)


def _timeouts(node: Node) -> Timeouts:
    f = node.mapping(_F(), _F(Timeouts.__slots__))
    return Timeouts(**optional(f, **dict.fromkeys(Timeouts.__slots__, Node.positive)))


def _limits(node: Node) -> ClientLimits:
    f = node.mapping(_F(), _F(ClientLimits.__slots__))
    return ClientLimits(
        **optional(
            f,
            header_timeout_s=Node.positive,
            body_timeout_s=Node.positive,
            max_body_bytes=lambda n: n.integer(1024, 1 << 31),
            max_connections=lambda n: n.integer(1, 1 << 20),
            max_connections_per_client=lambda n: n.integer(1, 1 << 20),
            max_in_flight=lambda n: n.integer(1, 1 << 20),
            write_timeout_s=Node.positive,
            max_answer_bytes=lambda n: n.integer(1024, 1 << 34),
        )
    )


def _gateway(node: Node, env: Mapping[str, str], base: Path) -> GatewaySettings:
    f = node.mapping(_GATEWAY_REQ, _GATEWAY_OPT)
    readers: dict[str, Callable[[Node], Any]] = {
        "listen": _listen,
        "client_inputs": _client_inputs,
        "unknown_fields": _unknown_fields,
        "timeouts": _timeouts,
        "limits": _limits,
        "access_log": Node.boolean,
        "handle_key": lambda n: read_handle_key(n, base),
        "handle_ttl_s": read_handle_ttl,
        "audit_log": lambda n: read_audit_log(n, env, base),
        "admin": lambda n: read_admin(n, env, base),
        "state_dir": lambda n: base / n.text(),
        "history": read_history,
        "routing": read_routing,
        "shared": lambda n: read_shared(n, env, base),
        "control": lambda n: read_control(n, env, base),
        "receipts": lambda n: read_receipts(n, base),
        "tracing": lambda n: read_tracing(n, env, base),
    }
    keys = guarded(lambda: _keys(f["namespace_keys"], env, base))
    pepper = guarded(lambda: resolve(f["api_key_pepper"], env, base, MIN_PEPPER_BYTES))
    # Each section on its own, so one run reports every section's errors (None: it had one).
    settings = optional(f, **{k: partial(_section, read) for k, read in readers.items()})
    if keys is None or pepper is None or None in settings.values():
        raise Bail()
    audit = settings.get("audit_log")
    if "receipts" in settings and (audit is None or audit.checkpoints is None):
        f["receipts"].fail(
            "receipts name their answer's record in the witnessed audit log: set "
            "gateway.audit_log with its checkpoints (name, key)"
        )
    return GatewaySettings(namespace_keys=keys, api_key_pepper=pepper, **settings)


def _section(read: Callable[[Node], T], node: Node) -> T | None:
    return guarded(lambda: read(node))


def _client_inputs(node: Node) -> ClientInputMode:
    return ClientInputMode(node.choice(("strip", "reject")))


def _unknown_fields(node: Node) -> UnknownFieldMode:
    return UnknownFieldMode(node.choice(("drop", "reject")))


def _registry(node: Node, gateway: GatewaySettings, base: Path) -> RegistrySettings:
    """`registry: true`, or `{store: database, path: FILE}`: the control-plane database holds
    it; `path` names a registry file an earlier version kept, imported into an empty database."""
    if node.node.tag == "tag:yaml.org,2002:bool":
        if not node.boolean():
            node.fail("must be true or a mapping (leave it out for no registry)")
        f: dict[str, Node] = {}
    else:
        f = node.mapping(_F(), _F({"store", "path"}))
    if "store" in f and f["store"].text() in ("file", "redis"):
        f["store"].fail(
            "the registry now lives in the control-plane database (gateway.control; SQLite in "
            "state_dir by default): remove store (a registry file is imported at first start)"
        )
    store = RegistryStore(f["store"].choice(tuple(RegistryStore))) if "store" in f else None
    control = gateway.control
    if "path" in f:
        path = base / f["path"].text()
    elif gateway.state_dir is not None:
        path = gateway.state_dir / "registry.json"
    elif control.database is ControlDatabase.SQLITE and control.path is None:
        node.fail(
            "the registry is kept in the control database under gateway.state_dir: set "
            "state_dir (or gateway.control)"
        )
    else:
        path = base / "registry.json"
    return RegistrySettings(store or RegistryStore.DATABASE, path)


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
    registry = None
    if "registry" in fields and settings is not None:
        registry = guarded(lambda: _registry(fields["registry"], settings, base))
    if errors.lines or version is None or settings is None:
        raise PolicyError(errors.lines)
    return Policy(source, version, settings, backends, tenants, public, registry)


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
    with recording() as read:
        try:
            policy = parse_policy(text, str(path), base=path.parent)
        except PolicyError as exc:
            exc.sources = frozenset(read)
            raise
    return replace(policy, sources=frozenset(read))
