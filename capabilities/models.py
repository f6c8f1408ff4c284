"""Credentials (encrypted at rest) and harvested MCP servers and tools (SPEC §5.2, §5.3).

Writes go through :mod:`capabilities.credentials` and :mod:`capabilities.mcp`;
nothing here decrypts, and no model ever holds a plaintext secret.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from workspaces.models import Workspace


class CredentialKind(models.TextChoices):
    BEARER = "bearer"
    BASIC = "basic"
    HEADER = "header"
    OAUTH2 = "oauth2"


class Credential(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="credentials")
    name = models.SlugField(max_length=100)
    kind = models.CharField(max_length=16, choices=CredentialKind.choices)
    # A Fernet token (MultiFernet, newest key first) of the JSON object of the
    # secret fields. Written only by capabilities.credentials; never read back
    # through the API or the admin.
    encrypted_value = models.TextField()
    # Non-secret settings: header_name, token_url, client_id, scopes, expires_at.
    metadata = models.JSONField(default=dict, blank=True)
    # Grants (capabilities.grants): where it may be sent, whether code steps may receive it,
    # which automations may use it (null: all). Set by those who manage credentials.
    allowed_destinations = models.JSONField(default=list, blank=True)
    allow_code_steps = models.BooleanField(default=False)
    allowed_automations = models.JSONField(null=True, blank=True, default=None)
    # Every step that uses it asks a human, whatever the autonomy (a standing approval never covers it).
    approval_always = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["workspace", "name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="credential_ws_name_unique")
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.name} ({self.kind})"


class McpTransport(models.TextChoices):
    HTTP = "http", "streamable HTTP"
    STDIO = "stdio"


class McpServer(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="mcp_servers")
    # Capability ids are "<slug>.<tool name>", so the slug has no dots.
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    transport = models.CharField(max_length=8, choices=McpTransport.choices, default=McpTransport.HTTP)
    # Not a URLField: service names without a dot ("http://mcp:8000/mcp") are valid here.
    url = models.CharField(max_length=2000, blank=True, default="")
    command = models.JSONField(default=list, blank=True, help_text="argv list for stdio servers")
    # Non-secret environment for stdio servers. A value "$credential" (or
    # "$credential.<field>") is replaced by the server's credential at spawn time.
    env = models.JSONField(default=dict, blank=True)
    credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="mcp_servers"
    )
    enabled = models.BooleanField(default=True)
    last_harvested_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workspace", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "slug"], name="mcp_server_ws_slug_unique")
        ]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.slug


class McpToolStatus(models.TextChoices):
    # Newly listed by its server: nobody has approved it yet, so it is not callable, not
    # offered to agents or drafting, and no glob allowlist picks it up until an admin approves.
    PENDING = "pending"
    ACTIVE = "active"
    # Its description or schemas changed since an admin approved it (rug-pull guard).
    DISABLED = "disabled"
    # No longer listed by the server; kept for the record, never deleted.
    REMOVED = "removed"


class RiskLevel(models.TextChoices):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class McpTool(models.Model):
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    input_schema = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(null=True, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    # sha256 of the canonical JSON of description + input/output schema.
    schema_hash = models.CharField(max_length=64)
    approved_hash = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16, choices=McpToolStatus.choices, default=McpToolStatus.PENDING)
    # Untrusted by default: the capability is high risk until an admin says otherwise.
    risk_override = models.CharField(max_length=16, choices=RiskLevel.choices, null=True, blank=True)
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["server", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="mcp_tool_server_name_unique")]
        verbose_name = "MCP tool"

    def __str__(self) -> str:
        return f"{self.server.slug}.{self.name}"

    @property
    def changed_since_approval(self) -> bool:
        return self.schema_hash != self.approved_hash
