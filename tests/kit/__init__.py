"""What tests and benchmarks both start: the gateway stack, our backend, processes, the Redis and
vLLM launchers, and the probes and tampering they apply. Nothing here is a test."""
