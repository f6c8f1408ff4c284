from __future__ import annotations

from django.urls import path

from . import views

# Any string, not only a UUID: an id that cannot exist answers the same 401 as one that does not.
# config.api_urls lists it before every other app's routes (no other pattern matches it), so the
# hot path's URL resolves at the first pattern tried instead of after all the others.
fire_urlpatterns = [
    path("automations/<str:automation_id>/fire", views.automation_fire, name="automation-fire"),
]

urlpatterns = [
    path("automations/<uuid:pk>/triggers", views.AutomationTriggers.as_view(), name="automation-triggers"),
    path("triggers/<uuid:pk>/rotate-token", views.TriggerRotateToken.as_view(), name="trigger-rotate-token"),
    path("triggers/<uuid:pk>/revoke-token", views.TriggerRevokeToken.as_view(), name="trigger-revoke-token"),
    path(
        "triggers/<uuid:pk>/rotate-signing-secret",
        views.TriggerRotateSigningSecret.as_view(),
        name="trigger-rotate-signing-secret",
    ),
]
