"""The third-party libraries whose internals the hot path uses, and the versions that code was written for.

Each library here has a fast path that reaches past its public API (docs/performance.md):
psycopg (the claim's ``BEGIN`` in its own query, its parse cache's size, result column
names), kombu and Celery (the embedded transport's alias, the worker fixup, a task message
written by hand), redis-py (a connection used without its pool), a2wsgi (the ASGI bridge).
``pyproject.toml`` bounds each from above at the same versions as :data:`BOUNDS` (a test
compares them). ``manage.py doctor`` prints the installed versions on one line.

:func:`fast_path` says whether to take one library's fast path: ``AUTOPLANE_FAST_PATHS`` is on
and the installed version is within its bounds. Outside them, the public path is taken and
one warning logged per process. The fast paths with a public path beside them ask it:
psycopg's (:mod:`config.one_round_trip`) and the direct ``LPUSH`` of a task message
(:mod:`automations.enqueue`, redis-py and kombu's wire format).
"""

from __future__ import annotations

import functools
import logging
import re
from importlib import metadata

from django.conf import settings

logger = logging.getLogger("config.seams")

# name: (lowest version, first version not supported), as in pyproject.toml.
BOUNDS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "psycopg": ((3, 2), (3, 4)),
    "kombu": ((5, 5), (5, 8)),
    "celery": ((5, 5), (5, 8)),
    "redis": ((5, 2), (8, 2)),
    "a2wsgi": ((1, 10), (1, 11)),
}


def installed(name: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def bounds_text(name: str) -> str:
    low, high = BOUNDS[name]
    return f">={_dotted(low)},<{_dotted(high)}"


def within(name: str, version: str | None = None) -> bool:
    """Whether ``version`` (the installed one by default) is one the fast path was written for."""
    version = installed(name) if version is None else version
    if version is None:
        return False
    low, high = BOUNDS[name]
    return low <= _release(version) < high


def outside() -> list[str]:
    """``"<name> <version> (written for <bounds>)"`` for each installed library outside its bounds."""
    found = []
    for name in BOUNDS:
        version = installed(name)
        if version is not None and not within(name, version):
            found.append(f"{name} {version} (written for {bounds_text(name)})")
    return found


@functools.cache
def _checked(name: str) -> bool:
    if within(name):
        return True
    logger.warning(
        "%s %s is outside the versions autoplane's fast path was written for (%s): using its public API",
        name, installed(name), bounds_text(name),
    )  # fmt: skip
    return False


def fast_path(name: str) -> bool:
    """Take ``name``'s fast path: ``AUTOPLANE_FAST_PATHS`` is on and the installed version is in bounds."""
    return bool(settings.AUTOPLANE_FAST_PATHS) and _checked(name)


def summary() -> str:
    """One line: each seamed library's installed version, then the switches."""
    versions = ", ".join(f"{name} {installed(name) or 'not installed'}" for name in BOUNDS)
    fast = "on" if settings.AUTOPLANE_FAST_PATHS else "off"
    prepared = "on" if settings.AUTOPLANE_PREPARED_STATEMENTS else "off"
    return f"{versions} (fast paths {fast}, prepared statements {prepared})"
