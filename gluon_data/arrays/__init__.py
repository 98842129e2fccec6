"""Framework-free datasets: numpy samples from any store, seeded joint transforms."""
