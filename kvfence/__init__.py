"""kvfence: the shared contract between gateway and backend (namespaces, handles, attestations)
and the command line. Imports neither `gateway` nor `backend` at module level."""

__version__ = "0.1.0"
