from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("audit", views.AuditEventListView.as_view(), name="audit-list"),
    path("audit/verify", views.AuditVerifyView.as_view(), name="audit-verify"),
    path("audit/<int:pk>", views.AuditEventDetailView.as_view(), name="audit-detail"),
    path("keys", views.PublicKeysView.as_view(), name="public-keys"),
]
