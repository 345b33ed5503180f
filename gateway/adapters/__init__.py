"""Adapters: how each backend kind takes a namespace (see `kinds.ADAPTERS`)."""
