from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("workspaces/<slug:slug>/channels", views.ChannelList.as_view(), name="channel-list"),
    path("workspaces/<slug:slug>/channels/<int:pk>", views.ChannelDetail.as_view(), name="channel-detail"),
]
