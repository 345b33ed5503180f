"""State the gateway's workers and replicas share: tenant limits and each backend's health, each
as a local table (one gateway's workers, through files) beside its Redis twin (every replica)."""
