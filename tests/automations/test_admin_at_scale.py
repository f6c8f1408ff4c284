"""Changelists over history (runs, steps, audit, events): no COUNT(*), no SELECT DISTINCT, no LIKE '%q%'."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission as AuthPermission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from automations import services
from automations.models import DomainEvent, Run, RunStatus, StepRun
from config import admin_paging
from tests.factories import definition, member, transform
from workspaces.models import Role
from workspaces.services import workspace_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def history():
    workspace = workspace_get_or_create(slug="acme")
    owner = member("owner", workspace, Role.ADMIN)
    automation = services.automation_create(workspace=workspace, definition=definition(transform("a", 1)),
                                            user=owner)  # fmt: skip
    runs = Run.objects.bulk_create(
        Run(workspace=workspace, automation=automation, automation_version=1, snapshot={}, queue="automations_default",
            status=RunStatus.SUCCEEDED if i % 3 else RunStatus.FAILED, trace_id=uuid.uuid4().hex)
        for i in range(12)
    )  # fmt: skip
    StepRun.objects.bulk_create(
        StepRun(run=run, index=0, step_id="a", action="transform_data", status="succeeded") for run in runs
    )
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(chain=f"ws-{workspace.pk}", timestamp=now, trace_id=run.trace_id, type="run.created",
                   summary="created", workspace_id=workspace.pk, refs={"run": str(run.pk)})
        for run in runs
    )  # fmt: skip
    DomainEvent.objects.bulk_create(
        DomainEvent(workspace=workspace, event_type="order.created", trace_id=f"t{i}", expires_at=now)
        for i in range(5)
    )
    superuser = get_user_model().objects.create_superuser("root", password="pw")
    staff = member("staffer", workspace, Role.VIEWER, is_staff=True)
    views = ["view_run", "view_steprun", "view_domainevent", "view_auditevent"]
    staff.user_permissions.add(*AuthPermission.objects.filter(codename__in=views))
    if connection.vendor == "postgresql":
        # The pages count by the planner's estimate past a limit: make it see these rows, not the
        # statistics an earlier test's thousands of (rolled back) rows left behind.
        with connection.cursor() as cursor:
            for model in (Run, StepRun, AuditEvent, DomainEvent):
                cursor.execute(f"ANALYZE {model._meta.db_table}")
    return {"runs": runs, "automation": automation, "superuser": superuser, "staff": staff}


def _pages(history) -> list[tuple[str, dict, int]]:
    """(changelist, query, how many rows it must show)."""
    run = history["runs"][4]
    runs, steps = reverse("admin:automations_run_changelist"), reverse("admin:automations_steprun_changelist")
    audit, events = (
        reverse("admin:audit_auditevent_changelist"),
        reverse("admin:automations_domainevent_changelist"),
    )
    return [
        (runs, {}, 12),
        (runs, {"status__exact": "failed"}, 4),
        (runs, {"trigger_type": "manual", "queue": "automations_default"}, 12),
        (runs, {"q": str(run.pk)}, 1),
        (runs, {"q": run.trace_id}, 1),
        (runs, {"q": "test autom"}, 12),  # the start of the automation's name
        (runs, {"q": run.trace_id[3:10]}, 0),  # a piece of an id is not a search
        (steps, {}, 12),
        (steps, {"q": str(run.pk)}, 1),
        (steps, {"action": "transform_data", "status__exact": "succeeded"}, 12),
        (audit, {}, -1),  # -1: every event, setup's own included
        (audit, {"type": "run.created"}, 12),
        (audit, {"q": run.trace_id}, 1),
        (audit, {"q": str(run.pk)}, 1),
        (events, {}, 5),
        (events, {"q": "t3"}, 1),
    ]


@pytest.mark.parametrize("who", ["superuser", "staff"])
def test_changelists_neither_count_nor_scan_for_distinct_values(history, who):
    client = Client()
    client.force_login(history[who])
    for url, query, expected in _pages(history):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, query)
        assert response.status_code == 200, (url, query)
        expected = AuditEvent.objects.count() if expected == -1 else expected
        assert response.context["cl"].result_count == expected, (url, query)
        sql = "\n".join(q["sql"].upper() for q in queries.captured_queries)
        assert "COUNT(" not in sql, (url, query)
        assert "DISTINCT" not in sql, (url, query)
        assert "LIKE '%" not in sql, (url, query)


def test_past_the_exact_limit_the_count_is_an_estimate(history, monkeypatch):
    monkeypatch.setattr(admin_paging, "EXACT_UP_TO", 5)
    client = Client()
    client.force_login(history["superuser"])
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("admin:automations_run_changelist"))
    assert response.status_code == 200
    count = response.context["cl"].result_count
    assert count >= 6  # at least what was counted before it stopped
    assert "COUNT(" not in "\n".join(q["sql"].upper() for q in queries.captured_queries)
    if connection.vendor == "postgresql":
        assert any(q["sql"].startswith("EXPLAIN") for q in queries.captured_queries)


def test_the_run_list_is_newest_first_by_its_index_order(history):
    client = Client()
    client.force_login(history["superuser"])
    response = client.get(reverse("admin:automations_run_changelist"))
    shown = [run.pk for run in response.context["cl"].result_list]
    assert shown == list(Run.objects.order_by("-created_at", "-id").values_list("pk", flat=True))


def test_far_past_the_limit_nothing_is_counted(history, monkeypatch):
    monkeypatch.setattr(admin_paging, "planner_estimate", lambda rows: 1_234_567)
    client = Client()
    client.force_login(history["superuser"])
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("admin:automations_run_changelist"), {"status__exact": "failed"})
    assert response.context["cl"].result_count == 1_200_000
    assert not any("LIMIT 1001" in q["sql"] for q in queries.captured_queries)


def test_pages_stop_at_the_cap_and_the_list_says_to_narrow_it(history, monkeypatch):
    from automations.admin import RunAdmin

    monkeypatch.setattr(admin_paging, "MAX_PAGES", 2)
    monkeypatch.setattr(RunAdmin, "list_per_page", 5)
    client = Client()
    client.force_login(history["superuser"])
    newest = list(Run.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    url = reverse("admin:automations_run_changelist")

    response = client.get(url, {"p": "2"})
    assert response.status_code == 200
    assert response.context["cl"].paginator.num_pages == 2  # 12 runs would be 3 pages
    assert [run.pk for run in response.context["cl"].result_list] == newest[5:10]
    assert "narrow the list with a filter or a search" in response.content.decode()

    deeper = client.get(url, {"p": "3"})  # past the cap (an old link): the deepest page offered
    assert deeper.status_code == 200
    assert [run.pk for run in deeper.context["cl"].result_list] == newest[5:10]

    narrowed = client.get(url, {"status__exact": "failed"})  # 4 runs: one page, no note
    assert "narrow the list" not in narrowed.content.decode()


_BIG_TABLES = ("automations_run", "automations_steprun", "audit_auditevent")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="plans are PostgreSQL's")
@pytest.mark.parametrize("who", ["superuser", "staff"])
def test_no_changelist_query_scans_a_history_table_at_a_few_thousand_rows(history, who):
    workspace_id, automation = history["runs"][0].workspace_id, history["automation"]
    runs = Run.objects.bulk_create(
        Run(workspace_id=workspace_id, automation=automation, automation_version=1, snapshot={},
            queue="automations_default", status=RunStatus.FAILED if i % 50 == 7 else RunStatus.SUCCEEDED,
            trace_id=uuid.uuid4().hex)
        for i in range(3000)
    )  # fmt: skip
    StepRun.objects.bulk_create(
        StepRun(run=run, index=0, step_id="a", action="transform_data", status="succeeded") for run in runs
    )
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(chain=f"ws-{workspace_id}", timestamp=now, trace_id=run.trace_id, workspace_id=workspace_id,
                   type="run.failed" if run.status == RunStatus.FAILED else "run.created", summary="x",
                   refs={"run": str(run.pk)})
        for run in runs + runs
    )  # fmt: skip
    with connection.cursor() as cursor:
        for table in _BIG_TABLES:
            cursor.execute(f"ANALYZE {table}")
    client = Client()
    client.force_login(history[who])
    run = runs[1234]
    runs_cl = reverse("admin:automations_run_changelist")
    steps_cl = reverse("admin:automations_steprun_changelist")
    audit_cl = reverse("admin:audit_auditevent_changelist")
    for url, query in [
        (runs_cl, {}), (runs_cl, {"p": "20"}), (runs_cl, {"status__exact": "failed"}), (runs_cl, {"q": run.trace_id}),
        (runs_cl, {"q": str(run.pk)}), (steps_cl, {}), (steps_cl, {"p": "20"}), (steps_cl, {"q": str(run.pk)}),
        (audit_cl, {}), (audit_cl, {"p": "20"}), (audit_cl, {"type": "run.failed"}), (audit_cl, {"q": str(run.pk)}),
        (audit_cl, {"q": run.trace_id}), (audit_cl, {"trace_id": run.trace_id}),
    ]:  # fmt: skip
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, query).status_code == 200
        for sql in [q["sql"] for q in queries.captured_queries]:
            if not sql.startswith("SELECT") or not any(f'FROM "{t}"' in sql for t in _BIG_TABLES):
                continue
            with connection.cursor() as cursor:
                # At this size a sequential scan is often the cheaper plan; the question is whether an
                # index serves the query at all (without one, the planner scans anyway).
                cursor.execute("SET enable_seqscan = off")
                cursor.execute(f"EXPLAIN {sql}")
                plan = "\n".join(row[0] for row in cursor.fetchall())
                cursor.execute("RESET enable_seqscan")
            scanned = [t for t in _BIG_TABLES if f"Seq Scan on {t}" in plan]
            assert not scanned, f"{who} {url} {query}\n{sql}\n{plan}"


def _pages_read(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pages read are PostgreSQL's")
def test_the_deepest_page_reads_its_rows_as_page_one_does(history):
    """Page 20 finds its first row's key (index-only, with OFFSET), then reads its rows from that key
    on in index order, as page 1 does: not 50 lookups by primary key, each one B-tree descent more."""
    workspace_id, automation = history["runs"][0].workspace_id, history["automation"]
    runs = Run.objects.bulk_create(
        Run(workspace_id=workspace_id, automation=automation, automation_version=1, snapshot={},
            queue="automations_default", status=RunStatus.SUCCEEDED, trace_id=uuid.uuid4().hex)
        for _ in range(3000)
    )  # fmt: skip
    StepRun.objects.bulk_create(
        StepRun(run=run, index=0, step_id="a", action="transform_data", status="succeeded") for run in runs
    )
    with connection.cursor() as cursor:
        for table in _BIG_TABLES:
            cursor.execute(f"ANALYZE {table}")
    client = Client()
    client.force_login(history["superuser"])
    for url, table in [(reverse("admin:automations_run_changelist"), "automations_run"),
                       (reverse("admin:automations_steprun_changelist"), "automations_steprun")]:  # fmt: skip
        read = {}
        for page in ("1", "20"):
            with CaptureQueriesContext(connection) as queries:
                response = client.get(url, {"p": page})
            assert response.status_code == 200
            assert len(response.context["cl"].result_list) == 50
            selects = [
                q["sql"] for q in queries.captured_queries if q["sql"].startswith(f'SELECT "{table}"."id",')
            ]
            assert len(selects) == 1, selects  # the page's rows, in one query
            read[page] = _pages_read(selects[0])
            if page == "20":
                assert " OFFSET 950" in "\n".join(q["sql"] for q in queries.captured_queries)
                assert " = ANY(" not in selects[0].upper(), selects[0]
                assert " IN (" not in selects[0].upper(), selects[0]
        assert read["20"] <= read["1"] + 3, (url, read)


def test_pages_past_the_first_split_ties_by_key_and_other_orders_still_page(history, monkeypatch):
    from automations.admin import RunAdmin

    monkeypatch.setattr(RunAdmin, "list_per_page", 5)
    Run.objects.update(created_at=timezone.now())  # every run ties on created_at: the id decides
    client = Client()
    client.force_login(history["superuser"])
    url = reverse("admin:automations_run_changelist")
    newest = list(Run.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    shown = [[run.pk for run in client.get(url, {"p": p}).context["cl"].result_list] for p in ("1", "2", "3")]
    assert shown == [newest[:5], newest[5:10], newest[10:]]
    # Sorted by the automation's name (through a relation: not a keyset), then by id.
    pages = [client.get(url, {"p": p, "o": "2"}).context["cl"] for p in ("1", "2", "3")]
    assert pages[0].queryset.query.order_by[0] == "automation__name"
    by_name = [[run.pk for run in cl.result_list] for cl in pages]
    assert by_name[1] == list(pages[1].queryset.values_list("pk", flat=True))[5:10]
    assert sorted(pk for page in by_name for pk in page) == sorted(newest)
