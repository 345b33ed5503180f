"""kvfence: the shared contract between gateway and backend (namespaces, handles, attestations,
the verdict) and the command line; `keys/`, `receipts/` and `probe/` beside it. Imports neither
`gateway` nor `backend` at module level."""

__version__ = "0.1.0"
