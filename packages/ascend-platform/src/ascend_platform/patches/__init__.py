"""The platform's patches: one registry, every patch declared in `catalogue`, none applied at import."""

from ascend_platform.patches.catalogue import REGISTRY
from ascend_platform.patches.registry import AppliedPatch, Patch, PatchRegistry, PatchTargetError

__all__ = ["REGISTRY", "AppliedPatch", "Patch", "PatchRegistry", "PatchTargetError"]
