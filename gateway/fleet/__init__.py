"""Beyond one machine: several backends per model (affinity routing, ejection, failover) and the
state gateway replicas share in Redis (tenant limits, quarantine and canary state)."""
