# Run.snapshot becomes nullable and is reached as ``snapshot_copy`` (same column, "snapshot"):
# a dispatched run keeps no copy of its automation version's definition (Run.snapshot reads
# the version). Existing runs keep their copies as they are: each is the definition it ran.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("automations", "0013_run_trace_hash_parent_partial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="snapshot",
            field=models.JSONField(
                blank=True,
                db_column="snapshot",
                null=True,
                help_text="The exact definition this run executes; empty: its automation version's definition.",
            ),
        ),
        migrations.RenameField(model_name="run", old_name="snapshot", new_name="snapshot_copy"),
    ]
