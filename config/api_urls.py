"""Every app's API under /api/v1/; each app owns its routes in <app>/api/urls.py."""

from __future__ import annotations

from django.urls import include, path

from triggers.api.urls import fire_urlpatterns

from .api_index import ApiIndex

urlpatterns = [
    *fire_urlpatterns,  # the webhook fire first: the hot path (triggers/api/urls.py)
    path("", ApiIndex.as_view(), name="api-index"),
    path("", include("audit.api.urls")),
    path("", include("automations.api.urls")),
    path("", include("capabilities.api.urls")),
    path("", include("approvals.api.urls")),
    path("", include("notifications.api.urls")),
    path("", include("triggers.api.urls")),
    path("", include("workspaces.api.urls")),
]
