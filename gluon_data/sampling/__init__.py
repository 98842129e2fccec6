"""Sample keys, orders, the distributed sampler and read-ahead samplers: pure functions of (seed, epoch)."""
