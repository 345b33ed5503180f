"""What a client may send, as the policy and the filters both read it: the proxied paths, the
body's JSON codec, the allowlist's lists and the client's cache-scoping inputs."""
