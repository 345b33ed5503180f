"""Receipts: for each answer, a signed event log its own tenant can fetch and verify offline
(`kvfence.receipts.receipt`), naming the answer's record in the witnessed audit log."""
