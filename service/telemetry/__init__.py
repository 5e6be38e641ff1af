"""What the service keeps of the nodes' samples (the store), its Prometheus metrics,
and the all-reduce probes' results."""
