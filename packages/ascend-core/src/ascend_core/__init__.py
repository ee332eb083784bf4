"""ascend_core: the Ascend plugin's upstream contract layer and its KV-cache specs, layout and allocation."""
