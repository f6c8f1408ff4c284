"""The run-reference key index over every event (audit_run_ref_key_idx), not only those with a run.

PostgreSQL's planner uses the statistics of an index expression only for a whole (not
partial) index: with 0013's partial audit_run_key_idx it estimated a run's events at 0.5%
of the ledger (40,000 rows at 8M events), and ANDed the bitmap with the workspace index
(~800k entries, 100-300 ms at 1M runs) instead of reading the run's 8 rows. Events without
a run have a NULL key, which deduplication keeps as few tuples. Built before the old one is
dropped.
"""

import django.db.models.fields.json
import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0013_compact_run_and_type_indexes'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(django.db.models.functions.text.Left(django.db.models.fields.json.KeyTextTransform('run', 'refs'), 7), name='audit_run_ref_key_idx'),
        ),
        migrations.RemoveIndex(
            model_name='auditevent',
            name='audit_run_key_idx',
        ),
    ]
