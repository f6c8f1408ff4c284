"""``manage.py check --deploy`` findings of this app: an unisolated code-step sandbox."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def sandbox_isolated(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if settings.AUTOPLANE_SANDBOX_BACKEND == "bubblewrap":
        return []
    return [
        checks.Warning(
            f"AUTOPLANE_SANDBOX_BACKEND={settings.AUTOPLANE_SANDBOX_BACKEND} with AUTOPLANE_SANDBOX_INSECURE="
            f"{str(settings.AUTOPLANE_SANDBOX_INSECURE).lower()}: code steps (run_python, run_shell) run "
            "unisolated, as the worker's user, and can read its data directory and keys.",
            hint="Use AUTOPLANE_SANDBOX_BACKEND=bubblewrap (docs/sandbox.md: in Docker the worker services "
            "need seccomp, AppArmor and system paths unconfined, as docker-compose.yml sets).",
            id="capabilities.W001",
        )
    ]
