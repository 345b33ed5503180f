"""Pure-Python bookkeeping: block pool, prefix cache, sequences, scheduler. No torch, no aiohttp."""
