"""Definitions as code: ``automations export|apply|record|test`` (issue 34; docs/definitions-as-code.md)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from automations import as_code, cases
from automations.models import Run
from config.errors import ServiceError
from workspaces.models import Workspace

SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def _workspace(slug: str | None) -> Workspace:
    if slug:
        workspace = Workspace.objects.filter(slug=slug).first()
        if workspace is None:
            raise CommandError(f"no workspace '{slug}'")
        return workspace
    workspaces = list(Workspace.objects.all()[:2])
    if len(workspaces) != 1:
        raise CommandError("name the workspace with --workspace")
    return workspaces[0]


def _failure(exc: ServiceError) -> CommandError:
    if exc.errors:
        lines = [
            f"{e.get('file', '-')}: {e.get('path') or '/'}: {e['code']}: {e['message']}" for e in exc.errors
        ]
        return CommandError(exc.message + "\n" + "\n".join(lines))
    return CommandError(exc.message)


class Command(BaseCommand):
    help = (
        "Definitions as code. 'export --workspace W DIR' writes one <slug>.json (or .yaml) per "
        "automation; 'apply DIR' prints the plan (create, update with a diff, unchanged, archive "
        "with --prune) and applies it in one transaction; --dry-run writes nothing."
    )

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)
        export = sub.add_parser("export", help="write one file per automation")
        export.add_argument("--workspace", required=True, help="the workspace's slug")
        export.add_argument("--format", choices=["json", "yaml"], default="json")
        export.add_argument("directory")
        apply = sub.add_parser("apply", help="make the workspace's automations what the files say")
        apply.add_argument("directory")
        apply.add_argument("--workspace", help="the workspace's slug (needed when there are several)")
        apply.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
        apply.add_argument("--prune", action="store_true", help="archive the automations that have no file")

        record = sub.add_parser("record", help="print a finished run as a test case")
        record.add_argument("run_id")
        test = sub.add_parser("test", help="replay test cases through the executor, no network")
        test.add_argument("path", help="a case file, or a directory of *.json cases")
        test.add_argument("--junit", metavar="PATH", help="also write a JUnit XML report")
        test.add_argument("--workspace", help="replay in this workspace, whatever the cases name")

    def handle(self, *args, **options) -> None:
        try:
            getattr(self, options["subcommand"])(options)
        except ServiceError as exc:
            raise _failure(exc) from exc

    def export(self, options) -> None:
        workspace = _workspace(options["workspace"])
        fmt = options["format"]
        directory = Path(options["directory"])
        directory.mkdir(parents=True, exist_ok=True)
        documents = as_code.workspace_documents(workspace)
        suffix = ".json" if fmt == "json" else ".yaml"
        for slug, document in documents.items():
            (directory / f"{slug}{suffix}").write_text(as_code.document_text(document, fmt), encoding="utf-8")
        self.stdout.write(f"exported {len(documents)} automation(s) of {workspace.slug} to {directory}")

    def apply(self, options) -> None:
        workspace = _workspace(options["workspace"])
        directory = Path(options["directory"])
        if not directory.is_dir():
            raise CommandError(f"{directory} is not a directory")
        sources = []
        for path in sorted(directory.iterdir()):
            fmt = SUFFIXES.get(path.suffix)
            if fmt is None or not path.is_file():
                continue
            source = as_code.Source(name=path.name)
            try:
                source.document = as_code.document_parse(path.read_text(encoding="utf-8"), fmt)
            except (ValueError, UnicodeDecodeError) as exc:
                source.error = str(exc)
            sources.append(source)
        plan = as_code.apply_documents(
            workspace=workspace, sources=sources, dry_run=options["dry_run"], prune=options["prune"],
            actor="command:automations apply",
        )  # fmt: skip
        self.stdout.write(as_code.plan_text(plan), ending="")

    def record(self, options) -> None:
        try:
            run = (
                Run.objects.select_related("automation__workspace")
                .filter(pk=uuid.UUID(options["run_id"]))
                .first()
            )
        except ValueError:
            raise CommandError("not a run id") from None
        if run is None:
            raise CommandError("no run with this id")
        self.stdout.write(json.dumps(cases.run_test_case(run), sort_keys=True, indent=2, ensure_ascii=False))

    def test(self, options) -> None:
        path = Path(options["path"])
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise CommandError(f"no case file at {path}")
        results = []
        started = time.perf_counter()
        for file in files:
            try:
                case = json.loads(file.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                result = cases.CaseResult(name=file.name, passed=False, problems=[f"not a JSON case: {exc}"])
            else:
                if options["workspace"] and isinstance(case, dict):
                    case["workspace"] = options["workspace"]
                result = cases.case_replay(case, name=file.name)
            results.append(result)
            self.stdout.write(
                f"{'PASS' if result.passed else 'FAIL'}  {file.name}  ({result.seconds * 1000:.0f} ms)"
            )
            for problem in result.problems:
                self.stdout.write("    " + problem.replace("\n", "\n    "))
        if options["junit"]:
            Path(options["junit"]).write_text(cases.junit_xml(results), encoding="utf-8")
        failed = sum(not r.passed for r in results)
        summary = f"{len(results) - failed} passed, {failed} failed in {time.perf_counter() - started:.2f}s"
        if failed:
            raise CommandError(summary)
        self.stdout.write(summary)
