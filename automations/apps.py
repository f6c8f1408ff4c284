from __future__ import annotations

from django.apps import AppConfig


class AutomationsConfig(AppConfig):
    name = "automations"

    def ready(self) -> None:
        from approvals.services import register_automation_lookup
        from workspaces.services import policies_check_register

        from .expressions.policy_rules import workspace_rule_issues
        from .selectors import automation_workspace_and_editor

        register_automation_lookup(automation_workspace_and_editor)
        policies_check_register(workspace_rule_issues)
