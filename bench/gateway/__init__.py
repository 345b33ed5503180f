"""Gateway benchmarks: overhead against a fake upstream, profiling, and their harness."""
