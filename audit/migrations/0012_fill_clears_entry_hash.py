"""The sequencer's fill also clears ``entry_hash``: the seal is needed only while an entry waits.

An entry's ``entry_hash`` seals its content from append until the sequencer chains it; the
sequencer checks it first, and from then on the event's ``hash`` covers the same content
and is vouched for by every later link and checkpoint. Keeping the 32 bytes on every
sequenced row costs ~256 bytes per two-step run. The guard now allows, in the one-time
fill only, ``entry_hash`` to become empty (nothing else about it): every other column must
stay as it was, as before. Rows sequenced earlier keep their seal (the guard refuses any
later change), and verification still checks a seal it finds above the newest checkpoint.
"""

import importlib

from django.db import migrations

_before = importlib.import_module("audit.migrations.0010_json_text")
_sequencer = importlib.import_module("audit.migrations.0005_sequencer")

_KEPT = tuple(c for c in _before._CONTENT if c != "entry_hash")
# The seal stays, or goes (empty bytes: what HexHashField stores for "").
_PG_SEAL = "(NEW.entry_hash IS NOT DISTINCT FROM OLD.entry_hash OR NEW.entry_hash = '\\x'::bytea)"
_SQLITE_SEAL = "(NEW.entry_hash IS OLD.entry_hash OR NEW.entry_hash = X'')"
_SQLITE_SAME = " AND ".join(f"NEW.{c} IS OLD.{c}" for c in _KEPT)

PG_GUARD = (
    _before.guard("json_typeof", "::text")
    .replace(_before._same(_before._CONTENT, "::text"), f"{_before._same(_KEPT, '::text')} AND {_PG_SEAL}")
)
assert PG_GUARD != _before.PG_GUARD
SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS audit_no_update;",
    f"CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_auditevent WHEN NOT ({_sequencer._FILL} AND "
    f"{_SQLITE_SAME} AND {_SQLITE_SEAL}) "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only (UPDATE refused)'); END;",
]
SQLITE_PREVIOUS = _sequencer.SQLITE_INSTALL[:1] + _sequencer.SQLITE_INSTALL[2:3]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_GUARD, params=None)  # the SQL holds a literal '%'
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_before.PG_GUARD, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_PREVIOUS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0011_short_key_indexes")]
    operations = [migrations.RunPython(install, remove)]
