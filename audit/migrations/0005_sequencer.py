"""Unsequenced entries, and the one UPDATE the ledger allows: the sequencer's fill.

Appends insert rows with ``seq``, ``prev_hash`` and ``hash`` NULL; the sequencer
fills those three once. The database refuses every other UPDATE (a row whose
sequence fields are set, or any change to its content) and every DELETE. On
SQLite, altering the columns rebuilds the table and drops migration 0002's
triggers with it, so they are installed again here in their new form.
"""

from django.db import migrations, models

# The content columns: equal before and after the fill, or the UPDATE is refused.
CONTENT = ("id", "chain", "timestamp", "trace_id", "stage", "type", "summary", "outcome",
           "workspace_id", "refs", "actor", "payload", "entry_hash")  # fmt: skip
_PG_SAME = " AND ".join(f"NEW.{c} IS NOT DISTINCT FROM OLD.{c}" for c in CONTENT)
_SQLITE_SAME = " AND ".join(f"NEW.{c} IS OLD.{c}" for c in CONTENT)
_FILL = "OLD.seq IS NULL AND NEW.seq IS NOT NULL AND NEW.prev_hash IS NOT NULL AND NEW.hash IS NOT NULL"

PG_INSTALL = f"""
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND {_FILL} AND {_PG_SAME} THEN
        RETURN NEW;  -- the sequencer's one-time fill of seq, prev_hash and hash
    END IF;
    RAISE EXCEPTION 'audit_auditevent is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent;
CREATE TRIGGER audit_append_only_row BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""
SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS audit_no_update;",
    "DROP TRIGGER IF EXISTS audit_no_delete;",
    f"CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_auditevent WHEN NOT ({_FILL} AND {_SQLITE_SAME}) "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (DELETE refused)'); END;",
]
SQLITE_REMOVE = ["DROP TRIGGER IF EXISTS audit_no_update;", "DROP TRIGGER IF EXISTS audit_no_delete;"]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)  # the SQL holds a literal '%'
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

    dependencies = [
        ('audit', '0004_chain_head_prev'),
    ]

    operations = [
        migrations.AddField(
            model_name='auditevent',
            name='entry_hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='hash',
            field=models.CharField(blank=True, max_length=64, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='prev_hash',
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='seq',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(condition=models.Q(('seq__isnull', True)), fields=['chain', 'id'], name='audit_unsequenced_idx'),
        ),
        migrations.RunPython(install, remove),
    ]
