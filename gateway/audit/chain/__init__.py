"""The HMAC-chained audit log: its format, the one writer of each chain (recovery, checkpoint,
rotation, anchor) and its verifier."""
