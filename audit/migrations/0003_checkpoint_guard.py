"""Signed checkpoints are never edited either: the database refuses UPDATE on them.

DELETE stays possible (test flushes and retention need it); a deleted checkpoint
can weaken tail detection only for copies of the ledger that were never exported.
"""

from __future__ import annotations

from django.db import migrations

PG_INSTALL = """
CREATE OR REPLACE FUNCTION audit_refuse_checkpoint_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditcheckpoint rows are immutable (UPDATE refused)';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_checkpoint_immutable BEFORE UPDATE ON audit_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_checkpoint_update();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS audit_checkpoint_immutable ON audit_auditcheckpoint;
DROP FUNCTION IF EXISTS audit_refuse_checkpoint_update();
"""
SQLITE_INSTALL = (
    "CREATE TRIGGER audit_checkpoint_no_update BEFORE UPDATE ON audit_auditcheckpoint "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditcheckpoint rows are immutable (UPDATE refused)'); END;"
)
SQLITE_REMOVE = "DROP TRIGGER IF EXISTS audit_checkpoint_no_update;"


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(SQLITE_INSTALL, params=None)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REMOVE, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(SQLITE_REMOVE, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_guard")]
    operations = [migrations.RunPython(install, remove)]
