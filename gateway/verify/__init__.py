"""Verifying external servers: canary rounds in reserved namespaces and varying request shapes
(`canary`, `timing`, `shapes`, `watch`), a detective audit that attributes every reported hit
(`render`, `fingerprints`, `detective`, over the history in `store` or `shared_history`),
content markers (`markers`, `scan`), and the rules that quarantine a backend (`quarantine`)."""
