from __future__ import annotations

from django.apps import AppConfig


class AutomationsConfig(AppConfig):
    name = "automations"

    def ready(self) -> None:
        from approvals.services import (
            register_automation_lookup,
            register_decision_listener,
            register_edit_check,
        )
        from workspaces.services import policies_check_register

        from . import approval_edits, events
        from .expressions.policy_rules import workspace_rule_issues
        from .selectors import automation_workspace_and_editor

        register_automation_lookup(automation_workspace_and_editor)
        register_edit_check(approval_edits.check_edit)
        policies_check_register(workspace_rule_issues)
        # approval.reminded / approval.escalated / approval.decided / approval.expired are domain
        # events (usable as event triggers); approvals publishes them through it.
        register_decision_listener(events.publish)
