"""Hashes as their 32 bytes, and no unique index on ``hash``.

``hash``, ``prev_hash`` and ``entry_hash`` held 64 hex characters; they now hold
the digest's bytes (``bytea`` / BLOB), which halves them in the row. The Python
side still sees hex (:class:`audit.models.HexHashField`), so what is hashed,
exported and shown is unchanged. ``hash`` loses its unique index: ``(chain,
seq)`` is unique and the hash covers both, and that index of random digests was
the ledger's largest (~1 KB per run).

The column types are changed here by hand: Django's own ALTER would cast the hex
text to its ASCII bytes. On SQLite the declared type does not matter (a BLOB is
stored as it is); the values are converted with the update trigger lifted for the
duration, and the column keeps its UNIQUE there (SQLite cannot drop it without
rebuilding the table, which would drop the guard's triggers too).
"""

import importlib

from django.db import migrations

import audit.models

_sequencer = importlib.import_module("audit.migrations.0005_sequencer")
_COLUMNS = ("hash", "prev_hash", "entry_hash")
_SQLITE_UPDATE_TRIGGER = _sequencer.SQLITE_INSTALL[2]


def _hash_unique_constraints(cursor) -> list[str]:
    cursor.execute(
        "SELECT c.conname FROM pg_constraint c JOIN pg_attribute a"
        " ON a.attrelid = c.conrelid AND c.conkey = ARRAY[a.attnum]"
        " WHERE c.conrelid = 'audit_auditevent'::regclass AND c.contype = 'u' AND a.attname = 'hash'"
    )
    return [name for (name,) in cursor.fetchall()]


def _sqlite_convert(schema_editor, convert) -> None:
    schema_editor.execute("DROP TRIGGER IF EXISTS audit_no_update")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT id, {', '.join(_COLUMNS)} FROM audit_auditevent")  # noqa: S608
        rows = cursor.fetchall()
        for event_id, *values in rows:
            cursor.execute(
                "UPDATE audit_auditevent SET hash = %s, prev_hash = %s, entry_hash = %s WHERE id = %s",
                [*(None if v is None else convert(v) for v in values), event_id],
            )
    schema_editor.execute(_SQLITE_UPDATE_TRIGGER)


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            for name in _hash_unique_constraints(cursor):
                schema_editor.execute(f'ALTER TABLE audit_auditevent DROP CONSTRAINT "{name}"')
        alter = ", ".join(f"ALTER COLUMN {c} TYPE bytea USING decode({c}, 'hex')" for c in _COLUMNS)
        schema_editor.execute(f"ALTER TABLE audit_auditevent {alter}")
    elif vendor == "sqlite":
        _sqlite_convert(schema_editor, lambda v: bytes.fromhex(v) if isinstance(v, str) else v)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        alter = ", ".join(f"ALTER COLUMN {c} TYPE varchar(64) USING encode({c}, 'hex')" for c in _COLUMNS)
        schema_editor.execute(f"ALTER TABLE audit_auditevent {alter}")
        schema_editor.execute(
            "ALTER TABLE audit_auditevent ADD CONSTRAINT audit_auditevent_hash_key UNIQUE (hash)"
        )
    elif vendor == "sqlite":
        _sqlite_convert(schema_editor, lambda v: bytes(v).hex() if isinstance(v, bytes | memoryview) else v)


class Migration(migrations.Migration):
    dependencies = [("audit", "0008_truncation_anchor_guard")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="auditevent",
                    name="entry_hash",
                    field=audit.models.HexHashField(blank=True, default="", max_length=64),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="hash",
                    field=audit.models.HexHashField(blank=True, max_length=64, null=True),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="prev_hash",
                    field=audit.models.HexHashField(blank=True, max_length=64, null=True),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        )
    ]
