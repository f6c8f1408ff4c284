"""Web and worker processes never load the MCP server side: only ``manage.py mcp_serve`` imports
``mcpserver.server`` (and with it the SDK's server, Starlette and uvicorn, for this app's part)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import live

WEB_AND_WORKER = """
import sys
from config.wsgi import application
from django.urls import get_resolver
from config.celery import app
get_resolver().url_patterns
app.loader.import_default_modules()
print(sorted(m for m in sys.modules if m.startswith("mcpserver")))
"""


def test_web_and_worker_start_without_the_mcp_server_module():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", WEB_AND_WORKER], cwd=live.REPO, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "['mcpserver', 'mcpserver.apps']"
