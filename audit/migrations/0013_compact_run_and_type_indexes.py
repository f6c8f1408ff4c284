"""Smaller keys for the ledger's type and run-reference indexes (docs/performance.md, storage per run).

- audit_type_key_idx: (hashtext(type), id) instead of (type, id): a 24-byte index tuple
  instead of 32; queries match the hash and re-check the type (audit.selectors.of_type),
  still an index scan in id order.
- audit_run_key_idx: the run reference's 7-character prefix alone, over the events that
  carry a run, instead of (prefix, id) over every event: a run's events share the key, so
  B-tree deduplication stores them as one tuple with a posting list of row ids (~12 bytes
  per event instead of ~53 as the index grows). A run's events are a bitmap scan and a sort
  of those few rows (audit.selectors.of_run).
- audit_anchor_idx: a chain's truncation anchors (a handful of rows), which the type index
  used to find: the newest anchor (verify, export) and the guard trigger's DELETE check.

The new indexes are built before the old ones are dropped.
"""

import audit.models
import django.db.models.fields.json
import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0012_fill_clears_entry_hash"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=audit.models.TypeKeyIndex(
                audit.models.TypeKey("type"), models.F("id"), name="audit_type_key_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("seq__isnull", False), ("type", "audit.anchor")),
                fields=["chain", "seq"],
                name="audit_anchor_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                django.db.models.functions.text.Left(
                    django.db.models.fields.json.KeyTextTransform("run", "refs"), 7
                ),
                condition=models.Q(
                    django.db.models.lookups.IsNull(
                        django.db.models.fields.json.KeyTextTransform("run", "refs"), False
                    )
                ),
                name="audit_run_key_idx",
            ),
        ),
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_type_idx",
        ),
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_run_prefix_idx",
        ),
    ]
