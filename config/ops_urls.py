"""Operational endpoints at the site root: liveness for load balancers and monitoring."""

from __future__ import annotations

from django.urls import path

from ops.health import healthz
from ops.metrics import metrics_view

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
]
