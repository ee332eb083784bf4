"""Worker, model runners (V1 and MRV2), KV binding and sleep mode of the Ascend platform."""
