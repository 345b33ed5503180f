"""The tenant registry of a running gateway: its store and watch (admin.py), `kvfence tenants` and
the registry actions of `kvfence keys` (cli.py, client.py)."""
