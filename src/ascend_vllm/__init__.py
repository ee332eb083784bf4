"""ascend-vllm: the meta-package that installs a consistent set of the Ascend plugin's packages, and its CLI."""
