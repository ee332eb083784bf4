"""Which runtime modules the engine-level tests reach: coverage of the engine processes, checked per module."""
