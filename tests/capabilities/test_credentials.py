"""Credentials: encrypted at rest, write-only, workspace-scoped, rotated, refreshed (SPEC §5.2)."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from automations import services as engine
from capabilities import credentials
from capabilities.base import ErrorCode, StepFailure
from capabilities.credentials import CredentialError
from capabilities.models import Credential
from tests.factories import client_for

pytestmark = pytest.mark.django_db

TOKEN = "tok-7f3a9c1e5b2d4f60a8e1"


def _all_audit_text() -> str:
    rows = AuditEvent.objects.values_list("summary", "payload", "refs", "actor")
    return json.dumps([list(row) for row in rows])


def _raw_rows() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM capabilities_credential")
        return json.dumps([list(map(str, row)) for row in cursor.fetchall()])


def test_credential_is_encrypted_at_rest_and_resolves_at_call_time(workspace, owner):
    credentials.credential_create(
        workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN}, user=owner
    )

    raw = _raw_rows()
    assert TOKEN not in raw
    stored = Credential.objects.get(name="api").encrypted_value
    assert stored.startswith("gAAAAA")  # a Fernet token

    value, secrets = credentials.credential_resolve(workspace_id=workspace.id, name="api")
    assert value == {"kind": "bearer", "token": TOKEN}
    assert secrets == [TOKEN]
    assert TOKEN not in repr(Credential.objects.get(name="api").__dict__)


def test_every_change_is_audited_without_the_value(workspace, owner):
    credential = credentials.credential_create(
        workspace=workspace,
        name="basic-auth",
        kind="basic",
        secret={"username": "svc", "password": TOKEN},
        user=owner,
    )
    credentials.credential_update_secret(
        credential=credential, secret={"username": "svc", "password": TOKEN + "-v2"}, user=owner
    )
    credentials.credential_delete(credential=credential, user=owner)

    types = list(AuditEvent.objects.filter(type__startswith="credential.").values_list("type", flat=True))
    assert types == ["credential.created", "credential.updated", "credential.deleted"]
    assert TOKEN not in _all_audit_text()


@pytest.mark.parametrize(
    ("kind", "secret", "metadata", "fragment"),
    [
        ("password", {"token": "x"}, {}, "kind must be one of"),
        ("bearer", {}, {}, "missing secret field(s) for bearer: token"),
        ("bearer", {"token": "x", "extra": "y"}, {}, "unknown secret field(s)"),
        ("bearer", {"token": ""}, {}, "must be a non-empty string"),
        ("basic", {"password": "p"}, {}, "username"),
        ("header", {"value": "v"}, {}, "header_name"),
        ("header", {"value": "v"}, {"header_name": "Bad Header"}, "not a valid HTTP header name"),
        ("oauth2", {"refresh_token": "r"}, {"token_url": "ftp://x", "client_id": "c"}, "http(s) URL"),
    ],
)
def test_invalid_credentials_are_refused_without_echoing_values(workspace, kind, secret, metadata, fragment):
    with pytest.raises(CredentialError) as caught:
        credentials.credential_create(
            workspace=workspace, name="c1", kind=kind, secret=secret, metadata=metadata
        )
    assert fragment in caught.value.message
    assert not Credential.objects.exists()


def test_names_are_unique_per_workspace_only(workspace, other_workspace):
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN})
    credentials.credential_create(
        workspace=other_workspace, name="api", kind="bearer", secret={"token": "other"}
    )
    with pytest.raises(CredentialError) as caught:
        credentials.credential_create(
            workspace=workspace, name="api", kind="bearer", secret={"token": "again"}
        )
    assert caught.value.code == "CONFLICT"
    assert credentials.credential_names(workspace.id) == {"api"}


def test_another_workspace_cannot_resolve_the_credential(workspace, other_workspace):
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN})

    with pytest.raises(StepFailure) as caught:
        credentials.credential_resolve(workspace_id=other_workspace.id, name="api")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    assert credentials.credential_names(other_workspace.id) == set()


def test_definition_in_another_workspace_reports_unknown_credential(workspace, other_workspace):
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=["127.0.0.1"])  # fmt: skip
    step = {"step_id": "call", "action": "http_request",
            "config": {"url": "http://127.0.0.1:9/x", "credential": "api"}}  # fmt: skip
    definition = {"schema_version": "1.0", "name": "uses api", "plan": [step]}

    engine.automation_create(workspace=workspace, definition=definition)  # fine where it exists
    with pytest.raises(engine.DefinitionInvalid) as caught:
        engine.automation_create(workspace=other_workspace, definition=definition)
    assert [e["code"] for e in caught.value.errors] == ["unknown_credential"]
    assert caught.value.errors[0]["path"] == "/plan/0/config/credential"


# --- keys and rotation ---------------------------------------------------------------


def test_rotation_reencrypts_every_row_under_the_newest_key(
    workspace, other_workspace, settings, credential_key
):
    for i, ws in enumerate([workspace, workspace, other_workspace]):
        credentials.credential_create(
            workspace=ws, name=f"c{i}", kind="bearer", secret={"token": f"{TOKEN}-{i}"}
        )
    before = dict(Credential.objects.values_list("pk", "encrypted_value"))
    new_key = Fernet.generate_key().decode()
    settings.AUTOPLANE_CREDENTIAL_KEYS = [new_key, credential_key]

    call_command("rotate_credentials")

    after = dict(Credential.objects.values_list("pk", "encrypted_value"))
    assert all(after[pk] != before[pk] for pk in before)
    newest_only = Fernet(new_key.encode())
    for pk, token in after.items():
        assert json.loads(newest_only.decrypt(token.encode()))["token"].startswith(TOKEN)
    settings.AUTOPLANE_CREDENTIAL_KEYS = [new_key]  # the old key is gone: everything still resolves
    value, _ = credentials.credential_resolve(workspace_id=other_workspace.id, name="c2")
    assert value["token"] == f"{TOKEN}-2"
    rotated = AuditEvent.objects.filter(type="credentials.rotated")
    assert sorted(rotated.values_list("payload__count", flat=True)) == [1, 2]


def test_rotation_names_rows_no_key_can_decrypt(workspace, settings):
    credentials.credential_create(workspace=workspace, name="lost", kind="bearer", secret={"token": TOKEN})
    settings.AUTOPLANE_CREDENTIAL_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(CommandError, match="could not be decrypted"):
        call_command("rotate_credentials")


def test_a_bad_key_is_a_configuration_error_that_does_not_echo_the_key(settings):
    settings.AUTOPLANE_CREDENTIAL_KEYS = ["not-a-fernet-key-but-secret"]
    with pytest.raises(credentials.CredentialKeyError) as caught:
        credentials.fernet()
    assert "not-a-fernet-key" not in str(caught.value)


def test_embedded_default_generates_one_private_key_file(settings, tmp_path):
    settings.AUTOPLANE_CREDENTIAL_KEYS = []
    settings.DATA_DIR = tmp_path

    token = credentials.encrypt({"token": TOKEN})
    again = credentials.decrypt(token)

    key_file = tmp_path / credentials.KEY_FILE_NAME
    assert again == {"token": TOKEN}
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_text().split()) == 1
    credentials.encrypt({"token": "x"})
    assert len(key_file.read_text().split()) == 1  # reused, not regenerated


# --- oauth2 refresh ------------------------------------------------------------------


class _TokenEndpoint(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self.server.requests.append(parse_qs(body))
        status, answer = self.server.answers.pop(0) if self.server.answers else (200, self.server.default)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def token_endpoint() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    server.requests, server.answers = [], []
    server.default = {
        "access_token": "fresh-access-1234567",
        "expires_in": 3600,
        "refresh_token": "rotated-refresh-99",
    }
    server.url = f"http://127.0.0.1:{server.server_address[1]}/token"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _oauth2(workspace, token_endpoint, **metadata):
    return credentials.credential_create(
        workspace=workspace, name="oauth", kind="oauth2",
        secret={"refresh_token": "refresh-abcdef-123", "client_secret": "client-secret-456"},
        metadata={"token_url": token_endpoint.url, "client_id": "autoplane", "scopes": ["read", "write"], **metadata},
    )  # fmt: skip


def test_oauth2_refreshes_a_missing_token_once_and_stores_it_encrypted(workspace, token_endpoint, settings):
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]  # the local token endpoint: loopback, deny-listed
    _oauth2(workspace, token_endpoint)

    value, secrets = credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    again, _ = credentials.credential_resolve(workspace_id=workspace.id, name="oauth")

    assert value["access_token"] == value["token"] == "fresh-access-1234567"
    assert "refresh_token" not in value
    assert "client_secret" not in value
    assert {"fresh-access-1234567", "rotated-refresh-99", "client-secret-456"} <= set(secrets)
    assert again["access_token"] == "fresh-access-1234567"
    assert len(token_endpoint.requests) == 1  # the second resolve used the stored token
    sent = token_endpoint.requests[0]
    assert sent["grant_type"] == ["refresh_token"]
    assert sent["refresh_token"] == ["refresh-abcdef-123"]
    assert sent["scope"] == ["read write"]
    raw = _raw_rows()
    assert "fresh-access-1234567" not in raw
    assert "rotated-refresh-99" not in raw
    stored = credentials.decrypt(Credential.objects.get(name="oauth").encrypted_value)
    assert stored["refresh_token"] == "rotated-refresh-99"  # the provider rotated it
    refreshed = AuditEvent.objects.get(type="credential.refreshed")
    assert refreshed.payload["expires_at"]
    text = _all_audit_text()
    for value in ("fresh-access-1234567", "rotated-refresh-99", "refresh-abcdef-123", "client-secret-456"):
        assert value not in text


def test_oauth2_refreshes_an_expired_token(workspace, token_endpoint):
    credential = _oauth2(workspace, token_endpoint)
    credentials.credential_update_secret(
        credential=credential,
        secret={"refresh_token": "refresh-abcdef-123", "access_token": "old-access-token-1"},
        metadata={**credential.metadata, "expires_at": (timezone.now() - timedelta(minutes=5)).isoformat()},
    )

    value, _ = credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    assert value["access_token"] == "fresh-access-1234567"


def test_oauth2_valid_token_is_used_without_a_request(workspace, token_endpoint):
    credential = _oauth2(workspace, token_endpoint)
    credentials.credential_update_secret(
        credential=credential,
        secret={"refresh_token": "refresh-abcdef-123", "access_token": "still-good-token-1"},
        metadata={**credential.metadata, "expires_at": (timezone.now() + timedelta(hours=1)).isoformat()},
    )

    value, _ = credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    assert value["access_token"] == "still-good-token-1"
    assert token_endpoint.requests == []


def test_oauth2_refused_refresh_is_a_clear_non_retryable_failure(workspace, token_endpoint):
    _oauth2(workspace, token_endpoint)
    token_endpoint.answers.append(
        (400, {"error": "invalid_grant", "error_description": "refresh-abcdef-123 revoked"})
    )

    with pytest.raises(StepFailure) as caught:
        credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    assert not caught.value.retryable
    assert "refresh-abcdef" not in caught.value.message


def test_oauth2_token_endpoint_outage_is_retryable(workspace, token_endpoint):
    _oauth2(workspace, token_endpoint)
    token_endpoint.answers.append((503, {}))

    with pytest.raises(StepFailure) as caught:
        credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    assert caught.value.code == ErrorCode.TEMPORARILY_UNAVAILABLE
    assert caught.value.retryable


def test_oauth2_token_url_goes_through_the_ssrf_guard(workspace, token_endpoint, settings):
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []
    workspace.egress_allowlist = []
    workspace.save(update_fields=["egress_allowlist"])
    _oauth2(workspace, token_endpoint)

    with pytest.raises(StepFailure) as caught:
        credentials.credential_resolve(workspace_id=workspace.id, name="oauth")
    assert caught.value.code == ErrorCode.POLICY_VIOLATION
    assert token_endpoint.requests == []


# --- API -------------------------------------------------------------------------------


def test_api_create_and_list_never_return_the_secret(api, workspace):
    created = api.post(
        "/api/v1/credentials",
        {
            "name": "api",
            "kind": "header",
            "secret": {"value": TOKEN},
            "metadata": {"header_name": "X-Api-Key"},
        },
        format="json",
    )
    listed = api.get("/api/v1/credentials")
    detail = api.get(f"/api/v1/credentials/{created.json()['id']}")

    assert created.status_code == 201, created.content
    assert set(created.json()) == {"id", "name", "kind", "metadata", "workspace", "created_at", "updated_at",
                                   "allowed_destinations", "allow_code_steps", "allowed_automations",
                                   "approval_always"}  # fmt: skip
    assert created.json()["metadata"] == {"header_name": "X-Api-Key"}
    assert listed.status_code == 200
    assert listed.json()["count"] == 1
    assert listed.json()["results"][0]["name"] == "api"
    for response in (created, listed, detail):
        assert TOKEN not in response.content.decode()
        assert "encrypted" not in response.content.decode()


def test_api_secret_replacement_is_write_only(api, workspace):
    created = api.post("/api/v1/credentials", {"name": "api", "kind": "bearer", "secret": {"token": TOKEN}},
                       format="json")  # fmt: skip
    replaced = api.post(f"/api/v1/credentials/{created.json()['id']}/secret", {"secret": {"token": TOKEN + "-2"}},
                        format="json")  # fmt: skip

    assert replaced.status_code == 200
    assert TOKEN not in replaced.content.decode()
    value, _ = credentials.credential_resolve(workspace_id=workspace.id, name="api")
    assert value["token"] == TOKEN + "-2"


def test_api_validation_errors_use_the_errors_shape(api, workspace):
    response = api.post("/api/v1/credentials", {"name": "api", "kind": "bearer", "secret": {"tokn": TOKEN}},
                        format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/secret"
    assert TOKEN not in response.content.decode()


def test_api_roles_viewer_lists_but_cannot_create_or_delete(workspace, owner, viewer):
    credential = credentials.credential_create(
        workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN}
    )
    client = client_for(viewer)

    assert client.get("/api/v1/credentials").json()["count"] == 1
    created = client.post("/api/v1/credentials", {"name": "x", "kind": "bearer", "secret": {"token": "abcd"},
                                                  "workspace": "acme"}, format="json")  # fmt: skip
    deleted = client.delete(f"/api/v1/credentials/{credential.pk}")
    assert created.status_code == 403
    assert deleted.status_code == 403
    assert created.json()["error"]["code"] == "PERMISSION_DENIED"
    assert Credential.objects.count() == 1


def test_api_other_workspace_objects_are_not_found(workspace, owner, outsider):
    credential = credentials.credential_create(
        workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN}
    )
    client = client_for(outsider)

    assert client.get("/api/v1/credentials").json()["count"] == 0
    assert client.get(f"/api/v1/credentials/{credential.pk}").status_code == 404
    assert client.delete(f"/api/v1/credentials/{credential.pk}").status_code == 404
    created = client.post("/api/v1/credentials", {"name": "x", "kind": "bearer", "secret": {"token": "abcd"},
                                                  "workspace": "acme"}, format="json")  # fmt: skip
    assert created.status_code == 404
    assert Credential.objects.count() == 1


def test_api_admin_deletes(api, workspace):
    credential = credentials.credential_create(
        workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN}
    )
    response = api.delete(f"/api/v1/credentials/{credential.pk}")
    assert response.status_code == 204
    assert not Credential.objects.exists()


# --- admin -----------------------------------------------------------------------------


def test_admin_creates_a_credential_write_only(admin_client, workspace):
    added = admin_client.post(
        "/admin/capabilities/credential/add/",
        {"workspace": workspace.pk, "name": "api", "kind": "bearer", "metadata": "{}", "secret": TOKEN},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    credential = Credential.objects.get(name="api")
    assert TOKEN not in _raw_rows()
    assert credentials.credential_resolve(workspace_id=workspace.id, name="api")[0]["token"] == TOKEN

    page = admin_client.get(f"/admin/capabilities/credential/{credential.pk}/change/").content.decode()
    listing = admin_client.get("/admin/capabilities/credential/").content.decode()
    assert TOKEN not in page
    assert credential.encrypted_value not in page
    assert 'type="password"' in page
    assert "api" in listing

    kept = admin_client.post(
        f"/admin/capabilities/credential/{credential.pk}/change/", {"metadata": "{}", "secret": ""}
    )
    assert kept.status_code == 302
    assert credentials.credential_resolve(workspace_id=workspace.id, name="api")[0]["token"] == TOKEN
    assert AuditEvent.objects.filter(type="credential.created", actor="user:root").exists()


def test_admin_form_errors_never_echo_the_secret(admin_client, workspace):
    response = admin_client.post(
        "/admin/capabilities/credential/add/",
        {"workspace": workspace.pk, "name": "hdr", "kind": "header", "metadata": "{}", "secret": TOKEN},
    )
    assert response.status_code == 200  # re-displayed with the error
    assert "header_name" in response.content.decode()
    assert TOKEN not in response.content.decode()
    assert not Credential.objects.exists()
