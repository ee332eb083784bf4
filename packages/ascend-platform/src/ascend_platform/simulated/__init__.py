"""Parts of the simulated-NPU lane that stand in for the device: Triton's interpreter and the MRV2 kernel overrides."""
