from __future__ import annotations

from django.apps import AppConfig


class McpServerConfig(AppConfig):
    """The platform's own MCP server (``manage.py mcp_serve``). Nothing here imports the ``mcp`` SDK:
    only ``mcpserver.server`` does, and only that command imports it."""

    name = "mcpserver"
    verbose_name = "MCP server"
