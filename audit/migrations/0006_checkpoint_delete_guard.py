"""Signed checkpoints cannot be deleted either (issue 12): the database refuses UPDATE and DELETE.

A deleted checkpoint would hide a truncated tail from anyone verifying this copy of the
ledger, so checkpoints are as append-only as the events. (Test flushes drop the guard
for the flush, as for the events; PostgreSQL flushes with TRUNCATE, which row triggers
do not see.)
"""

from __future__ import annotations

from django.db import migrations

PG_INSTALL = """
CREATE OR REPLACE FUNCTION audit_refuse_checkpoint_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditcheckpoint rows are immutable (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS audit_checkpoint_immutable ON audit_auditcheckpoint;
CREATE TRIGGER audit_checkpoint_immutable BEFORE UPDATE OR DELETE ON audit_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_checkpoint_change();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS audit_checkpoint_immutable ON audit_auditcheckpoint;
DROP FUNCTION IF EXISTS audit_refuse_checkpoint_change();
"""
# 0003's UPDATE-only guard, put back when this migration is reversed.
PG_PREVIOUS = """
CREATE TRIGGER audit_checkpoint_immutable BEFORE UPDATE ON audit_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_checkpoint_update();
"""
SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS audit_checkpoint_no_delete;",
    "CREATE TRIGGER audit_checkpoint_no_delete BEFORE DELETE ON audit_auditcheckpoint "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditcheckpoint rows are immutable (DELETE refused)'); END;",
]
SQLITE_REMOVE = ["DROP TRIGGER IF EXISTS audit_checkpoint_no_delete;"]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)  # the SQL holds a literal '%'
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REMOVE, params=None)
        schema_editor.execute(PG_PREVIOUS, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_REMOVE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_sequencer")]
    operations = [migrations.RunPython(install, remove)]
