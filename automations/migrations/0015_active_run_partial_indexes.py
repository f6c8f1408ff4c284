"""The sweep's lease index and the concurrency limit's index hold only active runs.

Their queries all ask for active statuses (queued, running, awaiting approval, waiting), so
finished runs, most of the table, need no entry in them, and the UPDATE that finishes a run
inserts into two indexes fewer. Built before the old ones are dropped.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("automations", "0014_run_snapshot_by_version"),
        ("workspaces", "0002_workspace_default_autonomy"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ("queued", "running", "awaiting_approval", "waiting"))),
                fields=["status", "lease_expires_at"],
                name="run_active_lease_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ("queued", "running", "awaiting_approval", "waiting"))),
                fields=["automation", "concurrency_key", "status"],
                name="run_active_concurrency_idx",
            ),
        ),
        migrations.RemoveIndex(
            model_name="run",
            name="run_status_lease_idx",
        ),
        migrations.RemoveIndex(
            model_name="run",
            name="run_concurrency_idx",
        ),
    ]
