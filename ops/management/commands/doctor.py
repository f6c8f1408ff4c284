"""``manage.py doctor``: one line per check (ok / warn / fail) and a fix; exit 1 when a check failed."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from ops.doctor import FAIL, as_dicts, diagnose

LABELS = {"ok": "OK  ", "warn": "WARN", "fail": "FAIL"}


class Command(BaseCommand):
    help = "Check the database, broker, workers, beat, sandbox, keys, settings, MCP servers and LLM; exit 1 on a failure."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="One JSON document for machines.")
        parser.add_argument(
            "--fast", action="store_true",
            help="Only what needs no worker, beat or peer: database, keys, settings, sandbox.",
        )  # fmt: skip

    def handle(self, *args, json: bool = False, fast: bool = False, **options):
        findings = diagnose(fast=fast)
        failed = any(f.status == FAIL for f in findings)
        if json:
            self.stdout.write(_dumps({"ok": not failed, "checks": as_dicts(findings)}))
        else:
            width = max(len(f.check) for f in findings)
            for finding in findings:
                line = f"{LABELS[finding.status]}  {finding.check:<{width}}  {finding.message}"
                if finding.fix and finding.status != "ok":
                    line += f"  -> {finding.fix}"
                self.stdout.write(line)
            counts = {s: sum(f.status == s for f in findings) for s in LABELS}
            self.stdout.write(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s)")
        if failed:
            raise SystemExit(1)


def _dumps(value) -> str:
    return json.dumps(value, indent=2)
