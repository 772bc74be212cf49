"""Pure: the model, its data and every decision about a cluster (no pyinfra, no I/O but reading data files)."""
