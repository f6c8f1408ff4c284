"""MCP servers' env values and URLs can hold literal secrets: a workspace's admins see them, its
viewers (API and admin) see env keys with masked values and URLs without userinfo or query values."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client

from capabilities import mcp
from tests.factories import client_for

pytestmark = pytest.mark.django_db

SECRET = "sk-live-9f8e7d6c5b4a"
URL = f"https://bot:{SECRET}@mcp.example.com:8443/v1/mcp?api_key={SECRET}&team=7#{SECRET}"


@pytest.fixture
def servers(workspace):
    http = mcp.mcp_server_create(workspace=workspace, slug="remote", transport="http", url=URL)
    stdio = mcp.mcp_server_create(workspace=workspace, slug="local", transport="stdio", command=["mcp-notes", "--api-key", SECRET, f"--token={SECRET}",
                                                                            "--verbose", f"https://u:{SECRET}@h/x"],
                                  env={"NOTES_TOKEN": SECRET, "LEVEL": "debug"})  # fmt: skip
    return http, stdio


def test_a_viewer_sees_env_keys_and_urls_masked(servers, viewer):
    http, stdio = servers
    client = client_for(viewer)

    listed = client.get("/api/v1/mcp-servers")
    one = client.get(f"/api/v1/mcp-servers/{http.pk}").json()
    local = client.get(f"/api/v1/mcp-servers/{stdio.pk}").json()

    assert listed.status_code == 200
    assert SECRET not in listed.content.decode()
    assert SECRET not in client.get("/api/v1/audit").content.decode()  # the mcp.server.created rows
    assert one["url"] == "https://***@mcp.example.com:8443/v1/mcp?api_key=***&team=***#***"
    assert local["env"] == {"NOTES_TOKEN": "***", "LEVEL": "***"}
    assert local["command"] == [
        "mcp-notes",
        "--api-key",
        "***",
        "--token=***",
        "--verbose",
        "https://***@h/x",
    ]


def test_an_admin_sees_them_as_configured(servers, owner):
    http, stdio = servers
    client = client_for(owner)

    assert client.get(f"/api/v1/mcp-servers/{http.pk}").json()["url"] == URL
    assert client.get(f"/api/v1/mcp-servers/{stdio.pk}").json()["env"]["NOTES_TOKEN"] == SECRET
    assert SECRET in client.get(f"/api/v1/mcp-servers/{stdio.pk}").json()["command"]


def test_a_viewer_in_the_admin_sees_them_masked(servers, viewer, owner):
    http, stdio = servers
    for user in (viewer, owner):
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        user.user_permissions.add(*AuthPermission.objects.filter(codename__endswith="mcpserver"))
    as_viewer, as_owner = Client(), Client()
    as_viewer.force_login(viewer)
    as_owner.force_login(owner)

    for server in (http, stdio):
        page = as_viewer.get(f"/admin/capabilities/mcpserver/{server.pk}/change/")
        assert page.status_code == 200
        assert SECRET not in page.content.decode()
    assert (
        "NOTES_TOKEN" in as_viewer.get(f"/admin/capabilities/mcpserver/{stdio.pk}/change/").content.decode()
    )
    assert (
        as_viewer.get("/admin/capabilities/mcpserver/", {"q": SECRET}).context["cl"].result_count == 0
    )  # no oracle
    assert SECRET in as_owner.get(f"/admin/capabilities/mcpserver/{stdio.pk}/change/").content.decode()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp"),
        ("http://user@[::1]:9/x?flag", "http://***@[::1]:9/x?***"),
        ("https://h/p?a=1&b=2", "https://h/p?a=***&b=***"),
        ("http://[bad", "***"),
        ("", ""),
    ],
)
def test_masked_url(url, shown):
    assert mcp.masked_url(url) == shown


def test_a_credential_reference_is_shown_as_is():
    assert mcp.masked_env({"TOKEN": "$credential.token", "KEY": "$credential", "X": "lit"}) == {
        "TOKEN": "$credential.token", "KEY": "$credential", "X": "***"}  # fmt: skip
