"""Receipts and the witnessed log they point into: canonical JSON, RFC 9162 Merkle proofs, C2SP
signed notes and checkpoints, the receipt and its offline check, the witness, and the
`kvfence receipt` and `kvfence witness` commands. The backend never imports this package."""
