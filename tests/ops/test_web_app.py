"""What ``manage.py up``'s web server imports (ops/asgi.py) before gunicorn forks its workers."""

from __future__ import annotations

import subprocess
import sys

from django.conf import settings


def test_the_served_app_loads_the_urlconf_and_freezes_its_heap_before_the_fork():
    probe = (
        "import gc, sys; import ops.asgi; "
        "print(gc.get_freeze_count() > 50000, 'triggers.api.views' in sys.modules, len(gc.get_objects()) < 20000)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=settings.BASE_DIR, capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-2000:]
