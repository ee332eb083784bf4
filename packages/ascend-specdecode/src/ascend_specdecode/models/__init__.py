"""Draft model classes the Ascend speculators build through upstream's class factories."""
