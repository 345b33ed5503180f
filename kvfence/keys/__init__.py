"""Keys: tenant API keys, Ed25519 key and trust files, reading a secret, and the `kvfence keys`
and `kvfence keygen` commands. Imports nothing else of `kvfence` at module level."""
