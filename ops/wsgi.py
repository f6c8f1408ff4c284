"""The WSGI app that ``manage.py up`` and docker-compose serve with gunicorn.

It is ``config.wsgi.application`` plus Django serving ``/static/`` itself (the
admin's CSS and JS, straight from the installed apps, no ``collectstatic``).
An operator console's traffic is small enough for that; put a CDN or a
reverse proxy in front if it is not.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

application = StaticFilesHandler(get_wsgi_application())
