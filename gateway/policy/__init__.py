"""The policy: YAML read once into frozen objects (`model`), validated with file:line errors
(`node`, `load`, `backends`, `tenants`, `keys`, `secrets`), compiled into the lookup tables
requests use (`runtime`) and swapped whole on reload (`reload`)."""
