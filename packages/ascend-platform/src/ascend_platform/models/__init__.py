"""Models whose upstream implementation cannot run on Ascend as vLLM picks it (see each subpackage)."""
