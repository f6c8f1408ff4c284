from __future__ import annotations

from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    name = "capabilities"

    def ready(self) -> None:
        # MCP tools live in the database; the registry reaches them through these
        # hooks (no queries at import time, only when a capability is looked up).
        from . import checks, mcp, registry  # noqa: F401 -- checks registers itself

        registry.external_lookup = mcp.capability_lookup
        registry.external_listing = mcp.capability_listing
        registry.external_held = mcp.capability_held
