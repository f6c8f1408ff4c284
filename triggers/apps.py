from __future__ import annotations

from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "triggers"
