from __future__ import annotations

import pytest

from workspaces.services import workspace_get_or_create


@pytest.fixture
def workspace(db):
    return workspace_get_or_create(slug="acme")


@pytest.fixture
def other_workspace(db):
    return workspace_get_or_create(slug="globex")
