"""Trace id and run reference indexed on a 7-character prefix, then id (audit.models.KEY_PREFIX).

The whole-value indexes were the ledger's largest (~640-735 bytes per two-step run each):
a uuid's 32-36 characters in every key. A prefix key of 8 bytes makes each index tuple 24
bytes instead of 56; queries match the prefix and re-check the whole value
(audit.selectors.of_trace / of_run), still an index scan in id order. The new indexes are
built before the old ones are dropped (writes wait while each is built: ~1 s per 100k
events here).
"""

import django.db.models.fields.json
import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0010_json_text'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(django.db.models.functions.text.Left('trace_id', 7), models.F('id'), name='audit_trace_prefix_idx'),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(django.db.models.functions.text.Left(django.db.models.fields.json.KeyTextTransform('run', 'refs'), 7), models.F('id'), name='audit_run_prefix_idx'),
        ),
        migrations.RemoveIndex(
            model_name='auditevent',
            name='audit_trace_idx',
        ),
        migrations.RemoveIndex(
            model_name='auditevent',
            name='audit_run_ref_idx',
        ),
    ]
