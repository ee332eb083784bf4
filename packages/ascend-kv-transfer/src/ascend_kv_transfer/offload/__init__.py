"""Host-memory KV offloading: an LRU tier keyed by block hash and the connector's two halves."""
