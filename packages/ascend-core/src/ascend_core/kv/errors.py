"""The error the KV layout and allocator raise: always names the layer or descriptor and the offending values."""


class KVLayoutError(ValueError):
    """A KV cache config, layout or view that cannot be honoured as given."""


class KVSpecMergeError(ValueError, AssertionError):
    """Layers of one group whose specs cannot merge. Also an AssertionError because vLLM's planner probes
    mergeability by catching AssertionError (as its own specs raise)."""
