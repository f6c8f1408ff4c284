from __future__ import annotations

from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    name = "capabilities"
