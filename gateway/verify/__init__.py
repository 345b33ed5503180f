"""Verifying external servers: canary rounds in reserved namespaces (`canary`), a detective
audit of every answer's cached tokens against the namespace's own history (`fingerprints`,
`history`, `detective`), content markers (`markers`), and the shared per-backend state that
quarantines a backend found sharing (`health`)."""
