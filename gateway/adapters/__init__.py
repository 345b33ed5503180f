"""Adapters: how each backend kind takes a namespace (see `registry.ADAPTERS`)."""
