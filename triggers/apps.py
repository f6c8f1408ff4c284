from __future__ import annotations

from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "triggers"

    def ready(self) -> None:
        # The engine never imports triggers: it calls these hooks and delivers events to subscribers.
        from automations import events, services

        from . import matching
        from .services import triggers_delete_for, triggers_sync

        if triggers_sync not in services.automation_saved_hooks:
            services.automation_saved_hooks.append(triggers_sync)
        if triggers_delete_for not in services.automation_deleted_hooks:
            services.automation_deleted_hooks.append(triggers_delete_for)
        events.subscribe(
            matching.event_matched,
            interested=matching.has_subscribers,
            interested_sql=matching.has_subscribers_sql(),
        )
