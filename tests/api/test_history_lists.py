"""The lists that grow with history (runs, audit): keyset pages, no COUNT, no OFFSET, index plans."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from automations import services
from automations.models import Run, RunStatus
from config.pagination import KeysetPagination
from tests.factories import client_for, member
from workspaces.models import Role
from workspaces.services import membership_set_role, workspace_get_or_create

pytestmark = pytest.mark.django_db

DEFINITION = {"schema_version": "1.0", "name": "noop", "plan": [{"step_id": "a", "action": "transform_data",
                                                                  "config": {"output": 1}}]}  # fmt: skip


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr(KeysetPagination, "page_size", 3)


@pytest.fixture
def world():
    acme, globex = workspace_get_or_create(slug="acme"), workspace_get_or_create(slug="globex")
    owner = member("owner", acme, Role.ADMIN)
    member_of_both = member("both", acme, Role.VIEWER)
    membership_set_role(workspace=globex, user=member_of_both, role=Role.VIEWER)
    automation = services.automation_create(workspace=acme, definition=DEFINITION, user=owner)
    other = services.automation_create(workspace=globex, definition=DEFINITION, user=None)
    return {"acme": acme, "globex": globex, "owner": owner, "both": member_of_both,
            "automation": automation, "other": other}  # fmt: skip


def _runs(automation, n: int, status: str = RunStatus.SUCCEEDED) -> list[Run]:
    rows = [
        Run(workspace_id=automation.workspace_id, automation=automation, automation_version=1, snapshot={},
            status=status, trace_id=uuid.uuid4().hex, queue="automations_default")
        for _ in range(n)
    ]  # fmt: skip
    return Run.objects.bulk_create(rows)


def _walk(client, url, params=None, link="next"):
    pages, body = [], client.get(url, params or {}).json()
    pages.append([r["id"] for r in body["results"]])
    while body[link]:
        body = client.get(body[link]).json()
        pages.append([r["id"] for r in body["results"]])
    return pages, body


def _expected_order(queryset) -> list[str]:
    return [str(pk) for pk in queryset.order_by("-created_at", "-id").values_list("id", flat=True)]


def test_runs_come_in_keyset_pages_forwards_and_back(world, small_pages):
    runs = _runs(world["automation"], 8)
    # ties on created_at are settled by id
    Run.objects.filter(pk__in=[r.pk for r in runs[2:6]]).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    client = client_for(world["owner"])
    pages, last = _walk(client, "/api/v1/runs")
    assert [len(p) for p in pages] == [3, 3, 2]
    assert sum(pages, []) == _expected_order(Run.objects.all())
    assert "count" not in last
    # and back from the last page, the same pages in reverse
    back, first = _walk(client, last["previous"], link="previous") if last["previous"] else ([], None)
    assert back == pages[-2::-1]
    assert first["previous"] is None


def test_a_filter_is_kept_in_the_links(world, small_pages):
    _runs(world["automation"], 4, RunStatus.FAILED)
    _runs(world["automation"], 4, RunStatus.SUCCEEDED)
    client = client_for(world["owner"])
    pages, _ = _walk(client, "/api/v1/runs", {"status": "failed"})
    assert sum(pages, []) == _expected_order(Run.objects.filter(status=RunStatus.FAILED))


def test_pages_are_stable_under_concurrent_inserts(world, small_pages):
    _runs(world["automation"], 6)
    client = client_for(world["owner"])
    first = client.get("/api/v1/runs").json()
    expected_rest = _expected_order(Run.objects.all())[3:]
    _runs(world["automation"], 5)  # newer runs arrive while the reader pages
    rest = []
    body = client.get(first["next"]).json()
    rest += [r["id"] for r in body["results"]]
    while body["next"]:
        body = client.get(body["next"]).json()
        rest += [r["id"] for r in body["results"]]
    assert rest == expected_rest


def test_a_reader_of_two_workspaces_sees_both_in_one_order(world, small_pages):
    _runs(world["automation"], 3)
    _runs(world["other"], 3)
    pages, _ = _walk(client_for(world["both"]), "/api/v1/runs")
    assert sum(pages, []) == _expected_order(Run.objects.all())
    pages, _ = _walk(client_for(world["owner"]), "/api/v1/runs")
    assert sum(pages, []) == _expected_order(Run.objects.filter(workspace=world["acme"]))


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/audit"])
def test_bad_or_forged_cursors_are_400(world, small_pages, url):
    _runs(world["automation"], 5)
    client = client_for(world["owner"])
    good = client.get(url).json()["next"]
    token = good.split("cursor=")[1] if good else "eyJrIjpbXX0:abc:def"
    forged_keys = token.replace(token[2], "A" if token[2] != "A" else "B", 1)
    for cursor in ("", "garbage", forged_keys, token + "x", "e30:1pQ:" + "x" * 43):
        response = client.get(url, {"cursor": cursor})
        assert response.status_code == 400, cursor
        assert response.json()["errors"][0]["path"] == "/cursor"


def test_a_cursor_of_another_list_is_refused(world, small_pages):
    _runs(world["automation"], 5)
    client = client_for(world["owner"])
    runs_cursor = client.get("/api/v1/runs").json()["next"].split("cursor=")[1]
    response = client.get("/api/v1/audit", {"cursor": runs_cursor})
    assert response.status_code == 400


def test_page_numbers_beyond_the_first_are_refused_with_the_way_to_page(world):
    client = client_for(world["owner"])
    assert client.get("/api/v1/runs", {"page": "1"}).status_code == 200
    response = client.get("/api/v1/runs", {"page": "2"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/page"
    assert "cursor" in response.json()["errors"][0]["message"]


def _audit_rows(workspace, n: int, run_ids: list[str]) -> None:
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(chain=f"ws-{workspace.pk}", timestamp=now, trace_id=f"t{i % 7}", type=f"step.t{i % 5}",
                   summary="x", workspace_id=workspace.pk, refs={"run": run_ids[i % len(run_ids)]})
        for i in range(n)
    )  # fmt: skip


def _list_requests(world) -> list[tuple[str, dict]]:
    run = Run.objects.filter(workspace=world["acme"]).first()
    return [
        ("/api/v1/runs", {}),
        ("/api/v1/runs", {"status": "failed"}),
        ("/api/v1/runs", {"automation": str(world["automation"].pk)}),
        ("/api/v1/runs", {"automation": str(world["automation"].pk), "status": "succeeded"}),
        ("/api/v1/audit", {}),
        ("/api/v1/audit", {"run": str(run.pk)}),
        ("/api/v1/audit", {"trace_id": "t1"}),
        ("/api/v1/audit", {"type": "step.t2"}),
    ]


def test_no_list_request_counts_or_offsets(world, small_pages):
    runs = _runs(world["automation"], 10)
    _audit_rows(world["acme"], 40, [str(r.pk) for r in runs])
    client = client_for(world["both"])
    for url, params in _list_requests(world):
        for depth in range(2):
            with CaptureQueriesContext(connection) as queries:
                body = client.get(url, params).json()
            sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
            assert "COUNT(" not in sql, (url, params)
            assert "OFFSET" not in sql, (url, params)
            if depth == 0 and body["next"]:
                url, params = body["next"], {}


def _plans(world, client) -> dict[str, str]:
    plans = {}
    for url, params in _list_requests(world):
        first = client.get(url, params).json()
        target = (first["next"], {}) if first["next"] else (url, params)
        with CaptureQueriesContext(connection) as queries:
            client.get(*target)
        table = "automations_run" if "runs" in url else "audit_auditevent"
        (sql,) = [q["sql"] for q in queries.captured_queries if f'FROM "{table}"' in q["sql"]]
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}")
            plans[f"{url} {params}"] = "\n".join(row[0] for row in cursor.fetchall())
    return plans


@pytest.mark.skipif(connection.vendor != "postgresql", reason="plans are PostgreSQL's")
def test_every_list_query_is_an_index_scan_at_a_few_thousand_rows(world, small_pages):
    runs = []
    for status in (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.FAILED):
        runs += _runs(world["automation"], 1000, status)
        runs += _runs(world["other"], 1000, status)
    _audit_rows(world["acme"], 4000, [str(r.pk) for r in runs[:1500]])
    _audit_rows(world["globex"], 4000, [str(r.pk) for r in runs[1500:]])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE automations_run")
        cursor.execute("ANALYZE audit_auditevent")
    for who in ("owner", "both"):
        for query, plan in _plans(world, client_for(world[who])).items():
            assert "Seq Scan" not in plan, f"{who} {query}\n{plan}"
            # A Sort node over the table's rows (a top-N of everything visible); an
            # Incremental Sort settling created_at ties by id is fine, and so is the sort of one
            # run's own events, found by their run key alone (audit_run_ref_key_idx, deduplicated).
            if re.search(r"(^|->  )Sort ", plan, re.M):
                assert "'run'" in query, f"{who} {query}\n{plan}"
                assert _scanned_indexes(plan) == {"audit_run_ref_key_idx"}, f"{who} {query}\n{plan}"


def _scanned_indexes(plan: str) -> set[str]:
    """The indexes the plan reads (index, index-only and bitmap index scans)."""
    return set(
        re.findall(
            r"(?:Index Scan(?: Backward)? using|Index Only Scan(?: Backward)? using|Bitmap Index Scan on) (\w+)",
            plan,
        )
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="plans are PostgreSQL's")
def test_the_hot_path_and_anchor_lookups_use_their_small_partial_indexes(world):
    """The sweep's and the concurrency limit's lookups ask only for active runs, which is all the
    partial indexes hold; the newest anchor of a chain (verify, export, the guard's DELETE check)
    has an index of the anchors alone; a type is found by its hash key in id order."""
    from audit.models import ANCHOR_TYPE
    from audit.selectors import audit_events
    from automations.models import ACTIVE_RUN_STATUSES

    automation, now = world["automation"], timezone.now()
    _runs(automation, 3000)
    _runs(automation, 2, RunStatus.RUNNING)
    _audit_rows(world["acme"], 4000, [str(uuid.uuid4()) for _ in range(500)])
    AuditEvent.objects.bulk_create(
        AuditEvent(chain=f"ws-{world['acme'].pk}", timestamp=now, trace_id="t", type="run.failed", summary="x",
                   workspace_id=world["acme"].pk, refs={})
        for _ in range(3)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE automations_run")
        cursor.execute("ANALYZE audit_auditevent")
    plans = {
        "run_active_concurrency_idx": Run.objects.filter(
            automation=automation, concurrency_key="", status__in=ACTIVE_RUN_STATUSES
        ).order_by(),
        "run_active_lease_idx": Run.objects.filter(
            status=RunStatus.RUNNING, lease_expires_at__lt=now
        ).order_by(),
        # audit.checkpoints.newest_anchor's query
        "audit_anchor_idx": AuditEvent.objects.filter(
            chain=f"ws-{world['acme'].pk}", type=ANCHOR_TYPE, seq__isnull=False
        ).order_by("-seq")[:1],
        "audit_type_key_idx": audit_events(workspace_ids=[world["acme"].pk], type="run.failed").order_by(
            "-id"
        )[:3],
    }
    for index, queryset in plans.items():
        plan = queryset.explain()
        assert "Seq Scan" not in plan, plan
        assert index in _scanned_indexes(plan), plan
        if index != "audit_type_key_idx":  # three rows of a rare type may be fetched and sorted
            assert not re.search(r"(^|->  )Sort ", plan, re.M), plan
    # A finished run is in neither partial index: the two stay the size of the active runs.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size('run_active_lease_idx'), pg_relation_size('run_status_created_idx')"
        )
        partial, full = cursor.fetchone()
    assert partial * 4 < full


@pytest.mark.skipif(connection.vendor != "postgresql", reason="plans are PostgreSQL's")
def test_the_planner_knows_a_run_has_few_events(world):
    """The run-reference key index is a whole index, so the planner has its expression's statistics
    (a partial one's are not used: it took a run for 0.5% of the ledger and ANDed in the workspace
    index, 100-300 ms at 8M events)."""
    from audit.selectors import of_run

    run_ids = [str(uuid.uuid4()) for _ in range(2000)]
    _audit_rows(world["acme"], 16000, run_ids)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_auditevent")
    plan = of_run(AuditEvent.objects.filter(workspace_id__in=[world["acme"].pk]), run_ids[7]).explain()
    (estimate,) = re.findall(r"Index Scan (?:using|on) audit_run_ref_key_idx .*?rows=(\d+)", plan)
    assert int(estimate) <= 40, plan  # 8 events a run; 0.5% of the table would be 80
