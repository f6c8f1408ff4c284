"""Fixtures for the audit ledger tests: a throwaway signing key, ways to tamper, users in workspaces."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
from django.db import connection

from audit import sequencer, writer
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent

_guard = importlib.import_module("audit.migrations.0005_sequencer")
_anchor_guard = importlib.import_module("audit.migrations.0008_truncation_anchor_guard")
_checkpoint_guard = importlib.import_module("audit.migrations.0006_checkpoint_delete_guard")
_current_guard = importlib.import_module("audit.migrations.0012_fill_clears_entry_hash")


@pytest.fixture(autouse=True)
def signing_key_file(signing_key_file):
    """Every test signs with its own key file (tests/conftest.py's fixture, used by every test here)."""
    return signing_key_file


@pytest.fixture(autouse=True)
def sequenced_appends(request, monkeypatch):
    """Most ledger tests examine chains: each append here is followed by a sequencer pass over its chain.

    Mark a test ``unsequenced`` to see appends as they are before the sequencer runs.
    """
    if request.node.get_closest_marker("unsequenced"):
        return
    append = writer.append

    def append_then_sequence(**kwargs):
        event = append(**kwargs)
        sequencer.sequence_chain(event.chain)
        event.refresh_from_db()
        return event

    monkeypatch.setattr(writer, "append", append_then_sequence)


def _drop_guard() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent")
            cursor.execute("DROP TRIGGER IF EXISTS audit_checkpoint_immutable ON audit_auditcheckpoint")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS audit_no_update")
            cursor.execute("DROP TRIGGER IF EXISTS audit_no_delete")
            for statement in _checkpoint_guard.SQLITE_REMOVE:
                cursor.execute(statement)


def _install_guard() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_guard.PG_REMOVE)
            cursor.execute(_anchor_guard.PG_INSTALL)
            cursor.execute(_current_guard.PG_GUARD)  # its function as it is now
            cursor.execute(_checkpoint_guard.PG_INSTALL)
        else:
            statements = _guard.SQLITE_REMOVE + _guard.SQLITE_INSTALL + _anchor_guard.SQLITE_INSTALL
            statements += _current_guard.SQLITE_INSTALL
            for statement in statements + _checkpoint_guard.SQLITE_INSTALL:
                cursor.execute(statement)


def _set_payload(event_id: int, payload: dict) -> None:
    _set_json_text(event_id, "payload", json.dumps(payload))


def _set_json_text(event_id: int, column: str, text: str) -> None:
    """Store ``text`` as the row's ``refs`` or ``payload``, verbatim (PostgreSQL keeps ``json`` text as given)."""
    assert column in ("refs", "payload")
    cast = "::json" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE audit_auditevent SET {column} = %s{cast} WHERE id = %s", [text, event_id])
        assert cursor.rowcount == 1


def _delete_events(ids: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM audit_auditevent WHERE id IN ({', '.join(['%s'] * len(ids))})",
            list(ids),
        )
        assert cursor.rowcount == len(ids)


def _rewind_head(chain: str, to: AuditEvent) -> None:
    """Make the head row agree with ``to``, as a careful attacker would after cutting the tail."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audit_auditchainhead SET seq = %s, head_hash = %s WHERE chain = %s",
            [to.seq, to.hash, chain],
        )


@pytest.fixture
def tamper(db):
    """Raw-SQL tampering helpers. Inside a test transaction the dropped trigger comes back on rollback."""
    _drop_guard()
    return SimpleNamespace(
        set_payload=_set_payload,
        set_json_text=_set_json_text,
        delete_events=_delete_events,
        rewind_head=_rewind_head,
        restore=_install_guard,
    )


@pytest.fixture
def committed_ledger(transactional_db):
    """For tests that need committed rows: empty the append-only tables afterwards.

    The flush between transactional tests cannot DELETE ledger rows past the
    trigger, so this removes them with the trigger briefly dropped.
    """
    yield
    _drop_guard()
    try:
        AuditEvent.objects.all().delete()
        AuditCheckpoint.objects.all().delete()
        AuditChainHead.objects.all().delete()
    finally:
        _install_guard()


@pytest.fixture
def api_users(db):
    """Alice administers workspace A, Bob views workspace B, Olga belongs nowhere; each with an API token."""
    from django.contrib.auth import get_user_model

    from tests.factories import api_token
    from workspaces.services import api_token_create

    alice_token = api_token_create(username="alice", workspace_slug="ws-a", role="admin")
    bob_token = api_token_create(username="bob", workspace_slug="ws-b", role="viewer")
    olga = get_user_model().objects.create(username="olga")
    olga_token = api_token(olga)
    from workspaces.models import Workspace

    return SimpleNamespace(
        alice=alice_token,
        bob=bob_token,
        olga=olga_token,
        ws_a=Workspace.objects.get(slug="ws-a"),
        ws_b=Workspace.objects.get(slug="ws-b"),
    )
