"""The one DELETE the ledger allows: rows of a chain below that chain's truncation anchor.

A truncation anchor (:mod:`audit.anchors`) is a sequenced event of type
``audit.anchor`` whose payload says "chain C continues from seq N". The guard
lets a row of chain C go only when such an anchor exists in C with N above the
row's seq; every other DELETE (and every UPDATE but the sequencer's fill) is
still refused. The guard checks that the anchor row exists; its signature is
checked by ``audit_verify``, so a forged anchor is reported there.
"""

import importlib

from django.db import migrations

ANCHOR_TYPE = "audit.anchor"  # audit.anchors.ANCHOR_TYPE, frozen here as migrations must be
_sequencer = importlib.import_module("audit.migrations.0005_sequencer")

_PG_ANCHORED = f"""OLD.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM audit_auditevent a
        WHERE a.type = '{ANCHOR_TYPE}' AND a.chain = OLD.chain AND a.seq IS NOT NULL
          AND a.payload->>'chain' = OLD.chain
          AND CASE WHEN jsonb_typeof(a.payload->'seq') = 'number'
                   THEN (a.payload->>'seq')::numeric > OLD.seq ELSE false END)"""
_SQLITE_ANCHORED = f"""OLD.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM audit_auditevent a
        WHERE a.type = '{ANCHOR_TYPE}' AND a.chain = OLD.chain AND a.seq IS NOT NULL
          AND json_extract(a.payload, '$.chain') = OLD.chain
          AND json_type(a.payload, '$.seq') = 'integer' AND json_extract(a.payload, '$.seq') > OLD.seq)"""

PG_INSTALL = f"""
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND {_sequencer._FILL} AND {_sequencer._PG_SAME} THEN
        RETURN NEW;  -- the sequencer's one-time fill of seq, prev_hash and hash
    END IF;
    IF TG_OP = 'DELETE' AND {_PG_ANCHORED} THEN
        RETURN OLD;  -- truncation below the chain's anchor
    END IF;
    RAISE EXCEPTION 'audit_auditevent is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent;
CREATE TRIGGER audit_append_only_row BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
PG_REMOVE = _sequencer.PG_REMOVE
SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS audit_no_delete;",
    f"CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_auditevent WHEN NOT ({_SQLITE_ANCHORED}) "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (DELETE refused)'); END;",
]
SQLITE_PREVIOUS = [_sequencer.SQLITE_INSTALL[1], _sequencer.SQLITE_INSTALL[3]]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)  # the SQL holds a literal '%'
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_sequencer.PG_INSTALL, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_PREVIOUS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_history_indexes")]
    operations = [migrations.RunPython(install, remove)]
