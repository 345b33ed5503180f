"""kvfence backend: a torch inference server whose KV pool is reachable only through signed
handles.

Its OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE, unless the environment sets
it), set here because OpenMP reads it once, when torch loads: the server's own event loop and
any other work share the cores, and workers that spin stall every parallel region while one of
them waits for a core (batch-1 decode on a loaded 2-core host: 0.8-2.5 tokens/s spinning,
18-20 sleeping; bench/README.md).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
