"""The KV pool behind `AscendStoreConnector`: blocks kept in a Mooncake Store by content hash, shared by engines."""
