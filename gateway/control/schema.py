"""The control-plane database's schema as numbered migrations, applied in order and recorded in
`kvfence_migrations`; the same statements serve SQLite and PostgreSQL.

Invariant: a migration, once released, never changes; a database whose newest migration is
unknown to this gateway (written by a newer one) is refused, never written to.
"""

from __future__ import annotations

from typing import Final

# (number, statements). BIGINT and DOUBLE PRECISION mean what they should in both engines;
# BYTEA is PostgreSQL's, so documents are stored as text (the registry document is JSON).
MIGRATIONS: Final[tuple[tuple[int, tuple[str, ...]], ...]] = (
    (
        1,
        (
            # Every version of the registry document, append-only: the newest is in force, and a
            # change is the insert of version + 1 (the primary key is the compare-and-set).
            "CREATE TABLE registry_versions (version BIGINT PRIMARY KEY, sha256 TEXT NOT NULL,"
            " document TEXT NOT NULL, written DOUBLE PRECISION NOT NULL, origin TEXT NOT NULL)",
            # Tokens spent per subject (a tenant or a registry key), period and calendar window.
            "CREATE TABLE spend (subject TEXT NOT NULL, period TEXT NOT NULL,"
            " window_start BIGINT NOT NULL, tokens BIGINT NOT NULL,"
            " PRIMARY KEY (subject, period, window_start))",
            # Tokens held for requests in flight: released when the answer settles, or when the
            # lease ends (a gateway that died mid-request).
            "CREATE TABLE reservations (id TEXT PRIMARY KEY, subject TEXT NOT NULL,"
            " tokens BIGINT NOT NULL, expires DOUBLE PRECISION NOT NULL)",
            "CREATE INDEX reservations_subject ON reservations (subject)",
            # Quarantine and release decisions per backend, append-only: the newest stands.
            "CREATE TABLE quarantine_decisions (seq BIGINT PRIMARY KEY, backend TEXT NOT NULL,"
            " quarantined INTEGER NOT NULL, reason TEXT NOT NULL,"
            " decided DOUBLE PRECISION NOT NULL, origin TEXT NOT NULL)",
            "CREATE INDEX quarantine_backend ON quarantine_decisions (backend, seq)",
        ),
    ),
    (
        2,
        (
            # Each tenant's receipt log: its entries' RFC 9162 leaf hashes (hex), by log origin
            # and index, append-only: the tree a tenant's receipts are proven in.
            "CREATE TABLE receipt_leaves (log TEXT NOT NULL, idx BIGINT NOT NULL,"
            " hash TEXT NOT NULL, PRIMARY KEY (log, idx))",
            # Receipts until they expire: the signed document and the log entry it names.
            "CREATE TABLE receipts (id TEXT PRIMARY KEY, tenant TEXT NOT NULL,"
            " expires DOUBLE PRECISION NOT NULL, document TEXT NOT NULL, entry TEXT NOT NULL)",
            "CREATE INDEX receipts_expires ON receipts (expires)",
            # The latest signed checkpoint of each receipt log (witnessed = 0) and the latest
            # one witnesses cosigned (witnessed = 1), as signed notes.
            "CREATE TABLE receipt_checkpoints (log TEXT NOT NULL, witnessed INTEGER NOT NULL,"
            " size BIGINT NOT NULL, note TEXT NOT NULL, PRIMARY KEY (log, witnessed))",
        ),
    ),
)
LATEST: Final = MIGRATIONS[-1][0]
CREATE_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS kvfence_migrations (number BIGINT PRIMARY KEY,"
    " applied DOUBLE PRECISION NOT NULL)"
)
