"""`kvfence probe`: a black-box scan of an OpenAI-compatible endpoint for prefix-cache sharing
between two credentials (docs/probe.md).

The core is meant for reuse (the gateway's canaries): `prompts` (fresh random prompts and
shared-prefix variants), `client` (`Identity`, `Endpoint`, `send`/`make_sender` over a caller's
aiohttp session), `rounds` (the paired procedures), `stats`, `sequential` and `power` (pure
statistics). `method` runs the whole probe; `decision` (its `outcome`, which the gateway's
canary rounds share), `report`, `plot` and `cli` present it.
This package imports neither `gateway` nor `backend`; scipy is never needed, matplotlib only for
`plot`.
"""
