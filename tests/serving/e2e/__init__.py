"""End-to-end serving tests (a package so the shared servers can be package-scoped)."""
