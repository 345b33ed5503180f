"""The control plane's durable home: tenants, keys and revocations, per-tenant settings, the
spend ledger and quarantine decisions, in SQLite (one gateway) or PostgreSQL (a fleet)."""
