"""Mooncake peer-to-peer KV transfer: schema, planning, the vLLM-free agent, and the connector's two halves."""
