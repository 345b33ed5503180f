"""Reading the policy's receipts settings: `gateway.receipts` (where receipts are kept, for how
long, and the keys that sign them) and a tenant's own `receipts`.

Invariant: keys are read once, at load, from files only; exactly one receipt key is active.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import yaml

from gateway.policy.keys import read_private_key, writable_folder
from gateway.policy.model import ReceiptKeySpec, ReceiptSettings
from gateway.policy.node import Node, optional, unique_items
from gateway.policy.tenant_model import TenantReceipts
from kvfence.keys.keyfile import KEY_ID_RE

_F = frozenset
MIN_KEEP_S: Final = 60.0
MAX_KEEP_S: Final = 10 * 365 * 86400.0


def _keep(node: Node) -> float:
    return node.number(MIN_KEEP_S, MAX_KEEP_S)


def _receipt_key(item: Node, base: Path) -> ReceiptKeySpec:
    f = item.mapping(_F({"id", "private_key"}), _F({"active"}))
    key_id = f["id"].text(KEY_ID_RE, "of [A-Za-z0-9._-], at most 64")
    ref, key = read_private_key(f["private_key"], base)
    return ReceiptKeySpec(key_id, ref, key, **optional(f, active=Node.boolean))


def read_receipts(node: Node, base: Path) -> ReceiptSettings:
    f = node.mapping(_F({"keys"}), _F({"keep_s", "path"}))
    path = writable_folder(f["path"], base / f["path"].text()) if "path" in f else None
    keys = unique_items(f["keys"], lambda n: _receipt_key(n, base), lambda k: k.id, "key id")
    if sum(k.active for k in keys) != 1:
        f["keys"].fail("exactly one receipt key must be active: true")
    return ReceiptSettings(path, keys, **optional(f, keep_s=_keep))


def read_tenant_receipts(node: Node | None) -> TenantReceipts:
    """`receipts: false`, or `receipts: {keep_s: SECONDS}` (absent: the gateway's default)."""
    if node is None:
        return TenantReceipts()
    if not isinstance(node.node, yaml.MappingNode):
        return TenantReceipts(enabled=node.boolean())
    f = node.mapping(_F(), _F({"enabled", "keep_s"}))
    return TenantReceipts(**optional(f, enabled=Node.boolean, keep_s=_keep))
