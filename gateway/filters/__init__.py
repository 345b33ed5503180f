"""The request filter chain (`gateway.app.CHAIN`): authn -> limit -> body -> route -> scrub ->
allowlist -> namespace -> replica -> public -> adapter; then the terminal step
(`gateway.routing.failover`). Each filter reads and writes `gateway.state` slots, may raise a
`GatewayError` to answer locally, and never imports another filter."""
