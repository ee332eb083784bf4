"""Tiny random checkpoints built offline, so engines run here without a model hub."""
