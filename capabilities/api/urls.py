from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("actions", views.ActionList.as_view(), name="action-list"),
    path("capabilities", views.CapabilityList.as_view(), name="capability-list"),
]
