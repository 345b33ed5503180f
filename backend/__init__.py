"""kvfence backend: a torch inference server whose KV pool is reachable only through signed
handles.

Its OpenMP threads spin a little before they sleep (OMP_WAIT_POLICY=PASSIVE with
GOMP_SPINCOUNT=5000, unless the environment sets either), set here because OpenMP reads them
once, when torch loads. A step is ~150 parallel regions: threads that slept after each one woke
for the next, which cost a third of a quiet host's decode and prefill speed; threads that spin
until work comes burn a core while the engine is idle. A short spin keeps the quiet host's speed
and sleeps when the engine has no work. On a busy host a spinning thread whose sibling lost its
core wastes the time that sibling needed, so the engine then runs fewer threads
(`backend.threads`, bench/README.md "omp_policy").
"""

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = "5000"
