from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("actions", views.ActionList.as_view(), name="action-list"),
    path("capabilities", views.CapabilityList.as_view(), name="capability-list"),
    path("credentials", views.CredentialList.as_view(), name="credential-list"),
    path("credentials/<int:pk>", views.CredentialDetail.as_view(), name="credential-detail"),
    path("credentials/<int:pk>/secret", views.CredentialSecret.as_view(), name="credential-secret"),
    path("mcp-servers", views.McpServerList.as_view(), name="mcp-server-list"),
    path("mcp-servers/<int:pk>", views.McpServerDetail.as_view(), name="mcp-server-detail"),
    path("mcp-servers/<int:pk>/harvest", views.McpServerHarvest.as_view(), name="mcp-server-harvest"),
    path("mcp-servers/<int:pk>/tools", views.McpServerTools.as_view(), name="mcp-server-tools"),
    path("mcp-tools/<int:pk>", views.McpToolDetail.as_view(), name="mcp-tool-detail"),
    path("mcp-tools/<int:pk>/approve", views.McpToolApprove.as_view(), name="mcp-tool-approve"),
]
