"""Delete an archived automation with its runs, steps and versions, for good (audited)."""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from automations import services
from automations.models import Automation


class Command(BaseCommand):
    help = (
        "Purge an archived automation (DELETE /api/v1/automations/{id} archives it first): its runs, "
        "steps, versions and triggers are deleted; the ledger keeps its rows and records the purge. "
        "Refused while runs are active."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("automation_id", help="the automation's id")

    def handle(self, *args, **options) -> None:
        try:
            automation = Automation.objects.filter(pk=uuid.UUID(options["automation_id"])).first()
        except ValueError:
            raise CommandError("not an automation id") from None
        if automation is None:
            raise CommandError("no automation with this id")
        try:
            counts = services.automation_purge(automation=automation, actor="command:purge_automation")
        except services.RunActionRefused as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"purged {automation.name}: {counts['runs']} run(s), {counts['steps']} step(s), "
                f"{counts['versions']} version(s); the ledger keeps its rows"
            )
        )
