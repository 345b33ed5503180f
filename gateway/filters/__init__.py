"""The request filter chain: authn -> body -> route -> scrub -> allowlist -> namespace ->
adapter; then the proxy. Each filter reads and writes `gateway.state` slots, may raise a
`GatewayError` to answer locally, and never imports another filter."""
