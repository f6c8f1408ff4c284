"""The database itself refuses UPDATE and DELETE on the ledger (SPEC §9)."""

from __future__ import annotations

from django.db import migrations

PG_INSTALL = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditevent is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_append_only_row BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""
SQLITE_INSTALL = [
    "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (DELETE refused)'); END;",
]
SQLITE_REMOVE = ["DROP TRIGGER IF EXISTS audit_no_update;", "DROP TRIGGER IF EXISTS audit_no_delete;"]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # params=None: the SQL holds a literal '%' (RAISE's format), not a placeholder.
        schema_editor.execute(PG_INSTALL, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REMOVE, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_REMOVE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(install, remove)]
