from __future__ import annotations

from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    name = "workspaces"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the deploy check)
