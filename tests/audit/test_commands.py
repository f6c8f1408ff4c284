"""manage.py keygen / audit_verify / audit_export / audit_checkpoint, the offline verifier and the beat task."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission as AuthPermission
from django.core.management import CommandError, call_command

from audit import signing, writer
from audit.models import AuditCheckpoint
from audit.tasks import audit_checkpoint
from tests.factories import member
from workspaces.services import workspace_get_or_create

OFFLINE = Path(settings.BASE_DIR) / "audit" / "offline_verify.py"
# Runs the offline verifier in a fresh interpreter in which importing Django fails.
_NO_DJANGO = "import runpy, sys; sys.modules['django'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _run(name: str, *args) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _offline(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-c", _NO_DJANGO, str(OFFLINE), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ledger(n: int = 4, workspace_id: int = 1):
    return [
        writer.append(
            trace_id="t", type="test.event", summary=f"event {i}", workspace_id=workspace_id, payload={"i": i}
        )
        for i in range(n)
    ]


# --- audit_verify -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_audit_verify_prints_counts_when_intact():
    _ledger(4)
    _run("audit_checkpoint")
    assert "4 events and 1 checkpoints verified" in _run("audit_verify")
    assert "4 events" in _run("audit_verify", "--chain", "ws-1")


@pytest.mark.django_db
def test_audit_verify_exits_1_naming_the_altered_row(tamper):
    # given an intact ledger whose guard trigger is dropped and one row edited with raw SQL
    events = _ledger(5)
    tamper.set_payload(events[3].id, {"i": "forged"})
    # when audit_verify runs
    with pytest.raises(CommandError) as failure:
        _run("audit_verify")
    # then it exits 1 naming that row's id
    assert failure.value.returncode == 1
    assert f"event id {events[3].id} " in str(failure.value)
    assert "altered" in str(failure.value)


@pytest.mark.django_db
def test_audit_verify_exits_1_naming_the_checkpoint_after_tail_truncation(tamper):
    events = _ledger(6)
    (checkpoint,) = _checkpoints()
    tamper.delete_events([e.id for e in events[3:]])
    tamper.rewind_head("ws-1", events[2])
    with pytest.raises(CommandError) as failure:
        _run("audit_verify")
    assert failure.value.returncode == 1
    assert f"no longer reaches checkpoint #{checkpoint.id}" in str(failure.value)


def _checkpoints():
    _run("audit_checkpoint")
    return list(AuditCheckpoint.objects.all())


# --- keygen -----------------------------------------------------------------------------------


def test_keygen_writes_a_key_and_never_prints_it(tmp_path):
    path = tmp_path / "new" / "key.pem"
    out = _run("keygen", "--path", str(path))
    key = signing.read_key_file(path)
    assert f"key_id: {signing.key_id_for(key.public_key())}" in out
    assert "PRIVATE" not in out
    assert path.read_text().split("\n")[1] not in out  # no line of the private PEM


def test_keygen_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "key.pem"
    _run("keygen", "--path", str(path))
    before = path.read_text()
    with pytest.raises(CommandError, match="already exists"):
        _run("keygen", "--path", str(path))
    assert path.read_text() == before
    _run("keygen", "--path", str(path), "--force")
    assert path.read_text() != before


def test_keygen_rotate_keeps_old_signatures_verifiable(signing_key_file):
    old_key_id, signature = signing.sign(b"checkpoint")
    out = _run("keygen", "--rotate")
    assert f"retired key {old_key_id}" in out
    assert signing.current_key_id() != old_key_id
    assert signing.verify(old_key_id, b"checkpoint", signature)
    assert {k["key_id"] for k in signing.public_keys()} == {old_key_id, signing.current_key_id()}


# --- export and offline verification ----------------------------------------------------------


@pytest.mark.django_db
def test_export_verifies_offline_without_django(tmp_path):
    _ledger(4, workspace_id=1)
    _ledger(2, workspace_id=2)
    writer.append(trace_id="t", type="platform.thing", summary="ü \u2603", payload={"x": [1.5, 1e-7, 2**70]})
    _run("audit_checkpoint")
    export = tmp_path / "export.jsonl"
    call_command("audit_export", "--output", str(export), stderr=io.StringIO())
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert lines[0]["kind"] == "header"
    assert [k["key_id"] for k in lines[0]["public_keys"]] == [signing.current_key_id()]
    assert sum(1 for line in lines if line["kind"] == "event") == 7
    assert sum(1 for line in lines if line["kind"] == "checkpoint") == 3

    result = _offline(export)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 events and 3 checkpoints verified" in result.stdout


@pytest.mark.django_db
def test_export_of_one_chain_to_stdout(tmp_path):
    _ledger(3, workspace_id=1)
    _ledger(2, workspace_id=2)
    text = _run("audit_export", "--chain", "ws-2")
    export = tmp_path / "ws2.jsonl"
    export.write_text(text)
    assert [json.loads(line)["kind"] for line in text.splitlines()] == ["header", "event", "event"]
    assert _offline(export).returncode == 0


@pytest.mark.django_db
def test_offline_verifier_detects_an_edited_export_line(tmp_path):
    events = _ledger(5)
    _run("audit_checkpoint")
    export = tmp_path / "export.jsonl"
    call_command("audit_export", "--output", str(export), stderr=io.StringIO())
    lines = export.read_text().splitlines()
    for i, text in enumerate(lines):
        record = json.loads(text)
        if record.get("id") == events[2].id and record["kind"] == "event":
            record["summary"] = "nothing happened here"
            lines[i] = json.dumps(record)
    export.write_text("\n".join(lines) + "\n")

    result = _offline(export)
    assert result.returncode == 1
    assert f"event id {events[2].id} " in result.stdout
    assert "altered" in result.stdout


@pytest.mark.django_db
def test_offline_verifier_detects_a_cut_tail_and_a_rewritten_chain(tmp_path):
    events = _ledger(5)
    (checkpoint,) = _checkpoints()
    export = tmp_path / "export.jsonl"
    call_command("audit_export", "--output", str(export), stderr=io.StringIO())
    lines = export.read_text().splitlines()

    # the last two events removed from the file
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-2]) + "\n")
    result = _offline(cut)
    assert result.returncode == 1
    assert f"no longer reaches checkpoint #{checkpoint.id}" in result.stdout

    # one event changed and every later hash recomputed: the signed head no longer matches
    records = [json.loads(line) for line in lines]
    prev = None
    for record in records:
        if record["kind"] != "event":
            continue
        if record["id"] == events[1].id:
            record["summary"] = "rewritten"
        if prev is not None:
            record["prev_hash"] = prev
        record["hash"] = writer.event_hash(record)
        prev = record["hash"]
    rewritten = tmp_path / "rewritten.jsonl"
    rewritten.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = _offline(rewritten)
    assert result.returncode == 1
    assert f"checkpoint #{checkpoint.id}" in result.stdout


@pytest.mark.django_db
def test_offline_verifier_with_trusted_key_rejects_a_foreign_key(tmp_path):
    _ledger(2)
    _run("audit_checkpoint")
    export = tmp_path / "export.jsonl"
    call_command("audit_export", "--output", str(export), stderr=io.StringIO())
    ours = tmp_path / "ours.pem"
    ours.write_text(signing.public_pem(signing.signing_key().public_key()))
    assert _offline(export, "--trusted-key", ours).returncode == 0
    other = tmp_path / "other.pem"
    other.write_text(signing.public_pem(signing.generate_key_file(tmp_path / "other-key.pem").public_key()))
    result = _offline(export, "--trusted-key", other)
    assert result.returncode == 1
    assert "untrusted key" in result.stdout


# --- the beat task ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_checkpoint_task_signs_moved_chains():
    _ledger(3)
    assert audit_checkpoint.name == "autoplane.audit_checkpoint"
    assert audit_checkpoint.run() == 1
    assert audit_checkpoint.run() == 0
    assert AuditCheckpoint.objects.get().seq == 3


# --- the admin --------------------------------------------------------------------------------


@pytest.fixture
def admin_client_(db, client):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    return client


def test_admin_ledger_is_read_only(admin_client_):
    event = writer.append(trace_id="trace-x", type="test.admin", summary="shown in admin")
    listing = admin_client_.get("/admin/audit/auditevent/?q=trace-x")
    assert listing.status_code == 200
    assert b"shown in admin" in listing.content
    assert admin_client_.get("/admin/audit/auditevent/add/").status_code == 403
    detail = admin_client_.get(f"/admin/audit/auditevent/{event.id}/change/")
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    assert admin_client_.get(f"/admin/audit/auditevent/{event.id}/delete/").status_code == 403


def test_admin_verify_chain_action_reports_the_result(admin_client_, tamper):
    events = _ledger(3)
    data = {"action": "verify_chain", "_selected_action": [events[0].id]}
    page = admin_client_.post("/admin/audit/auditevent/", data, follow=True)
    assert b"ledger OK: 3 events" in page.content
    tamper.set_payload(events[1].id, {"i": "forged"})
    page = admin_client_.post("/admin/audit/auditevent/", data, follow=True)
    assert f"event id {events[1].id} ".encode() in page.content


def test_admin_verify_the_ledger_button_needs_no_selection(admin_client_, tamper):
    events = _ledger(3)
    listing = admin_client_.get("/admin/audit/auditevent/").content.decode()
    assert 'id="verify-ledger"' in listing
    assert listing.index(f">{events[2].id}<") < listing.index(f">{events[0].id}<")  # newest first

    page = admin_client_.post("/admin/audit/auditevent/verify/", follow=True)
    assert b"ledger OK: 3 events" in page.content
    tamper.set_payload(events[1].id, {"i": "forged"})
    page = admin_client_.post("/admin/audit/auditevent/verify/", follow=True)
    assert b"ledger BROKEN" in page.content
    assert f"event id {events[1].id} ".encode() in page.content
    assert admin_client_.get("/admin/audit/auditevent/verify/").status_code == 405


def test_admin_shows_one_trace(admin_client_):
    writer.append(trace_id="trace-a", type="test.admin", summary="in trace a")
    writer.append(trace_id="trace-b", type="test.admin", summary="in trace b")

    page = admin_client_.get("/admin/audit/auditevent/?trace_id=trace-a").content.decode()

    assert "Audit trace trace-a" in page
    assert "in trace a" in page
    assert "in trace b" not in page


def test_admin_writes_checkpoints_on_demand(admin_client_):
    _ledger(2)
    assert b"Write checkpoint now" in admin_client_.get("/admin/audit/auditcheckpoint/").content
    page = admin_client_.post("/admin/audit/auditcheckpoint/write-now/", follow=True)
    assert b"1 checkpoint(s) written" in page.content
    (checkpoint,) = AuditCheckpoint.objects.all()
    _ledger(1)
    data = {"action": "write_checkpoint_now", "_selected_action": [checkpoint.id]}
    page = admin_client_.post("/admin/audit/auditcheckpoint/", data, follow=True)
    assert b"1 checkpoint(s) written" in page.content
    assert AuditCheckpoint.objects.count() == 2


@pytest.mark.django_db
def test_staff_see_only_their_workspaces_ledger_rows(client):
    mine, theirs = workspace_get_or_create(slug="mine"), workspace_get_or_create(slug="theirs")
    viewer = member("vic", mine, "viewer", is_staff=True)
    viewer.user_permissions.add(AuthPermission.objects.get(codename="view_auditevent"))
    writer.append(trace_id="t-mine", type="test.admin", summary="row of mine", workspace_id=mine.id)
    writer.append(trace_id="t-theirs", type="test.admin", summary="row of theirs", workspace_id=theirs.id)
    client.force_login(viewer)

    page = client.get("/admin/audit/auditevent/").content.decode()

    assert "row of mine" in page
    assert "row of theirs" not in page
