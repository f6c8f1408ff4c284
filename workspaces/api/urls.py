from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("workspaces", views.WorkspaceList.as_view(), name="workspace-list"),
    path("workspaces/<slug:slug>", views.WorkspaceDetail.as_view(), name="workspace-detail"),
    path("workspaces/<slug:slug>/members", views.WorkspaceMembers.as_view(), name="workspace-members"),
    path("tokens", views.ApiTokenList.as_view(), name="api-token-list"),
    path("tokens/<int:pk>", views.ApiTokenDetail.as_view(), name="api-token-detail"),
    path("tokens/<int:pk>/revoke", views.ApiTokenRevoke.as_view(), name="api-token-revoke"),
]
