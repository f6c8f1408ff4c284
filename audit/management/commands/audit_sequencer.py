"""``manage.py audit_sequencer``: chain appended audit entries, forever (``up`` runs one), or once."""

from __future__ import annotations

import os
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from audit.sequencer import run_forever, sequence_pending


class Command(BaseCommand):
    help = (
        "Integrate appended audit entries into their hash chains, in order, every "
        "AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS (or once with --once). Safe to kill at any point."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="sequence what is waiting now, then exit")

    def handle(self, *args, once: bool, **options):
        if once:
            self.stdout.write(f"{sequence_pending()} entries sequenced")
            return
        if settings.AUTOPLANE_AUDIT_SEQUENCER_NICE:
            # Background work: on a busy machine the web and worker processes of a run's path go first.
            os.nice(settings.AUTOPLANE_AUDIT_SEQUENCER_NICE)
        stopping = []
        # Restored on the way out: run in-process (call_command), a handler left behind would be
        # inherited by every process forked later, which then survives a SIGTERM (a Pool's terminate).
        previous = {
            signum: signal.signal(signum, lambda *_: stopping.append(True))
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self.stdout.write(
                f"audit sequencer: every {settings.AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS:g} s, "
                f"max merge delay {settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS:g} s, "
                f"nice +{settings.AUTOPLANE_AUDIT_SEQUENCER_NICE}"
            )
            run_forever(
                interval=settings.AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS, stop=lambda: bool(stopping)
            )
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
