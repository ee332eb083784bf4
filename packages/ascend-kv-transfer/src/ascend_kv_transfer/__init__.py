"""KV transfer for vLLM on any platform: Mooncake P2P and layerwise disaggregated prefill, host-memory offloading and
a KV pool over Mooncake Store.

Connectors (`registration.CONNECTORS`, registered with vLLM's factory by the `vllm.general_plugins` entry point):
`AscendMooncakeConnector`, `AscendMooncakeLayerwiseConnector`, `AscendOffloadingConnector`, `AscendStoreConnector`.
Importing this package imports neither vLLM nor Mooncake.
"""
