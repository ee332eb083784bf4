"""KV transfer for vLLM on any platform: Mooncake P2P and layerwise disaggregated prefill, host-memory offloading.

Connectors (registered with vLLM's factory by the `vllm.general_plugins` entry point, see `registration`):
`AscendMooncakeConnector`, `AscendMooncakeLayerwiseConnector`, `AscendOffloadingConnector`. Importing this package
imports neither vLLM nor Mooncake.
"""
