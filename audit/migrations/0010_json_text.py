"""``refs`` and ``payload`` as ``json``: the exact text the writer hashed, kept verbatim.

``jsonb`` re-serialises what it stores (keys ordered by length, spaces after ``:`` and
``,``), so its text is not the canonical JSON the hashes are taken over; ``json`` keeps
the text it is given, so verification can hash the stored text in SQL (audit/verify.py).

Existing rows are converted to canonical text in the same rewrite of the table
(``USING audit_canonical_json(col)::json``): sorted keys (by code point), ``,``/``:``
without spaces, strings escaped as Python's json does. The value is unchanged, so every
hash still holds. One case is not made identical: a non-integral number keeps ``jsonb``'s
decimal text (``1e-07`` stays ``0.0000001``); such a row's SQL hash differs and the
verifier's Python path judges it by value (docs/audit.md, "Verifying").

The guard trigger compared every column with ``IS NOT DISTINCT FROM``; ``json`` has no
equality operator, so ``refs`` and ``payload`` are compared as text (a whitespace-only
edit is a change, and refused like any other). The truncation check reads the anchor's
payload with ``json_typeof``.
"""

from django.db import migrations

import audit.models

ANCHOR_TYPE = "audit.anchor"  # frozen, as in 0008
_CONTENT = ("id", "chain", "timestamp", "trace_id", "stage", "type", "summary", "outcome",
            "workspace_id", "refs", "actor", "payload", "entry_hash")  # fmt: skip
_JSON = ("refs", "payload")


def _same(columns, cast) -> str:
    return " AND ".join(
        f"NEW.{c}{cast if c in _JSON else ''} IS NOT DISTINCT FROM OLD.{c}{cast if c in _JSON else ''}"
        for c in columns
    )


_FILL = "OLD.seq IS NULL AND NEW.seq IS NOT NULL AND NEW.prev_hash IS NOT NULL AND NEW.hash IS NOT NULL"


def guard(typeof: str, cast: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND {_FILL} AND {_same(_CONTENT, cast)} THEN
        RETURN NEW;  -- the sequencer's one-time fill of seq, prev_hash and hash
    END IF;
    IF TG_OP = 'DELETE' AND OLD.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM audit_auditevent a
        WHERE a.type = '{ANCHOR_TYPE}' AND a.chain = OLD.chain AND a.seq IS NOT NULL
          AND a.payload->>'chain' = OLD.chain
          AND CASE WHEN {typeof}(a.payload->'seq') = 'number'
                   THEN (a.payload->>'seq')::numeric > OLD.seq ELSE false END) THEN
        RETURN OLD;  -- truncation below the chain's anchor
    END IF;
    RAISE EXCEPTION 'audit_auditevent is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
"""


PG_GUARD = guard("json_typeof", "::text")
PG_GUARD_BEFORE = guard("jsonb_typeof", "")

# Canonical JSON text of a jsonb value (as audit.writer.canonical_json writes it, up to the
# spelling of non-integral numbers). Exists only while the migration runs.
_CANONICAL_FN = """
CREATE FUNCTION pg_temp.audit_canonical_json(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE jsonb_typeof(v)
        WHEN 'object' THEN '{' || coalesce((
            SELECT string_agg(to_json(k)::text || ':' || pg_temp.audit_canonical_json(x), ',' ORDER BY k COLLATE "C")
            FROM jsonb_each(v) AS e(k, x)), '') || '}'
        WHEN 'array' THEN '[' || coalesce((
            SELECT string_agg(pg_temp.audit_canonical_json(x), ',' ORDER BY n)
            FROM jsonb_array_elements(v) WITH ORDINALITY AS a(x, n)), '') || ']'
        ELSE v::text
    END;
END;
$$;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite keeps JSON as text already
    schema_editor.execute(_CANONICAL_FN, params=None)
    alter = ", ".join(
        f"ALTER COLUMN {c} TYPE json USING pg_temp.audit_canonical_json({c})::json" for c in _JSON
    )
    schema_editor.execute(f"ALTER TABLE audit_auditevent {alter}")
    schema_editor.execute("DROP FUNCTION pg_temp.audit_canonical_json(jsonb)")
    schema_editor.execute(PG_GUARD, params=None)  # the SQL holds a literal '%'


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    alter = ", ".join(f"ALTER COLUMN {c} TYPE jsonb USING {c}::jsonb" for c in _JSON)
    schema_editor.execute(f"ALTER TABLE audit_auditevent {alter}")
    schema_editor.execute(PG_GUARD_BEFORE, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0009_hashes_as_bytes")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="auditevent",
                    name="payload",
                    field=audit.models.CanonicalJSONField(blank=True, default=dict),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="refs",
                    field=audit.models.CanonicalJSONField(blank=True, default=dict),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        )
    ]
