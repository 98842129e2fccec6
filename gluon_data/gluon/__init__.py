"""The Gluon layer: NDArray datasets, batchify, DataLoader, InputNormalize, distributed metrics, the launcher (needs MXNet)."""
