"""Speculators on vLLM's Model Runner V2 interfaces: thin subclasses of the upstream ones (see `base`)."""
