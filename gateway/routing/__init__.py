"""Several backends per model: rendezvous affinity, this worker's passive ejection, each
backend's health check, and the terminal step that retries on the next backend."""
