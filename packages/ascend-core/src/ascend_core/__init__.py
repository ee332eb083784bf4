"""ascend_core: the Ascend plugin's upstream contract layer and its KV-cache specs, layout and allocation."""

__version__ = "0.1.0"
