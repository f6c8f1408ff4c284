from __future__ import annotations

from django.apps import AppConfig


class AutomationsConfig(AppConfig):
    name = "automations"
