"""What ``manage.py up`` and docker-compose serve: gunicorn's asyncio worker in front of Django's WSGI app.

gunicorn's ``asgi`` worker reads and parses every request on its event loop,
so a client that sends its headers slowly, or stalls (slowloris), holds a
socket and nothing else; a request's whole body is read on the loop too, under an
absolute deadline (``AUTOPLANE_BODY_READ_TIMEOUT_SECONDS``, then 408) and a size cap
(``DATA_UPLOAD_MAX_MEMORY_SIZE``, then 413). Only a complete request reaches Django, which runs
in a fixed pool of ``AUTOPLANE_WEB_THREADS`` threads per process (a2wsgi's
WSGI-in-ASGI adapter, see :mod:`ops.wsgi_adapter`): a bounded number of threads,
each keeping its own persistent database connection, exactly as a threaded WSGI
server would.
(Django's own ASGI handler would give every request a new thread, and so a
new database connection, which a PostgreSQL server runs out of under load.)

Before gunicorn's ``--preload`` forks the workers, the URLconf (the API, the
admin, their serializers and schema code) is loaded too, and everything loaded
so far is moved out of the cyclic garbage collector's reach (``gc.freeze()``):
~150k long-lived objects that a full collection would otherwise walk every few
hundred requests (~0.4-1 ms per fire on average, in 100 ms pauses that land on
the p99), and pages that a collection's writes would copy in every worker.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.conf import settings  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from config.celery import app as celery_app  # noqa: E402
from ops.wsgi import application as wsgi_application  # noqa: E402
from ops.wsgi_adapter import WholeResponseWSGIMiddleware  # noqa: E402

# kombu imports the broker's transport (SQLAlchemy on the embedded lane) on the first
# connection; import it now, so that gunicorn's workers forked after --preload share it.
celery_app.connection_for_write().get_transport_cls()

application = WholeResponseWSGIMiddleware(
    wsgi_application,
    workers=settings.AUTOPLANE_WEB_THREADS,
    body_limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    body_timeout=settings.AUTOPLANE_BODY_READ_TIMEOUT_SECONDS,
)

get_resolver().url_patterns  # noqa: B018 - imports every app's views now, not on the first request
gc.collect()
gc.freeze()
