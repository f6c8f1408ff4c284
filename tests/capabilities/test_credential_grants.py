"""Credential use is a granted permission (issue 12, finding 3).

An operator may use credentials but not manage them. What a step can do with one is set on
the credential by those who manage credentials: where it may be sent, whether code steps may
receive it, which automations may use it. A reference that breaks a grant is refused at
save (``credential_not_granted``) and, when only the run shows it, fails the step with
``POLICY_VIOLATION`` before the secret leaves.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from automations import services as engine
from automations.models import Run, StepRun
from capabilities import credentials
from capabilities.base import ErrorCode, StepFailure
from tests.factories import client_for, member
from workspaces.models import Role

TOKEN = "grant-test-t0ken-5e1f"


class _Echo(BaseHTTPRequestHandler):
    """Answers with the Authorization header it got, base64-encoded: an echo that transforms."""

    hits: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization") or ""
        self.hits.append(self.path)
        body = json.dumps({"auth_b64": base64.b64encode(auth.encode()).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def operator(workspace):
    return member("grant-operator", workspace, Role.OPERATOR)


def call(url: str, credential: str = "api", **extra) -> dict:
    return {
        "step_id": "call",
        "action": "http_request",
        "config": {"url": url, "credential": credential, **extra},
    }


def automation(workspace, user, *steps, inputs: dict | None = None):
    doc = {"schema_version": "1.0", "name": "uses a credential", "plan": list(steps)}
    if inputs:
        doc["inputs"] = {"schema": {"type": "object", "properties": inputs}}
    return engine.automation_create(workspace=workspace, definition=doc, user=user)


def run(drive, automation, user, inputs: dict | None = None) -> tuple[Run, StepRun]:
    result = engine.run_create(automation=automation, inputs=inputs or {}, user=user)
    finished = drive(result.run.pk)
    return finished, finished.steps.get(step_id="call")


def refused_codes(workspace, user, *steps) -> list[tuple[str, str]]:
    with pytest.raises(engine.DefinitionInvalid) as info:
        automation(workspace, user, *steps)
    return [(e["path"], e["code"]) for e in info.value.errors]


# --- destinations -----------------------------------------------------------------------


def test_a_credential_goes_only_to_its_allowed_destinations(workspace, operator, drive, echo):
    # given: a credential granted to 127.0.0.1, and one granted to another host only
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=["127.0.0.1"])  # fmt: skip
    credentials.credential_create(workspace=workspace, name="elsewhere", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=["https://api.example.com/v1/"])  # fmt: skip
    # when / then: the allowed destination gets it, and its transformed echo is redacted
    finished, step = run(drive, automation(workspace, operator, call(f"{echo}/ok")), operator)
    assert finished.status == "succeeded", finished.error
    stored = json.dumps(step.output)
    assert base64.b64encode(f"Bearer {TOKEN}".encode()).decode() not in stored
    assert "[REDACTED]" in stored
    # a literal URL elsewhere is refused at save
    assert refused_codes(workspace, operator, call(f"{echo}/nope", "elsewhere")) == [
        ("/plan/0/config/credential", "credential_not_granted")
    ]


def test_a_templated_url_outside_the_grant_fails_the_step_before_anything_is_sent(
    workspace, operator, drive, echo
):
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=["api.example.com"])  # fmt: skip
    saved = automation(workspace, operator, call("{{ inputs.url }}"), inputs={"url": {"type": "string"}})
    before = len(_Echo.hits)

    finished, step = run(drive, saved, operator, {"url": f"{echo}/exfiltrate"})

    assert finished.status == "failed"
    assert step.output["error"]["code"] == ErrorCode.POLICY_VIOLATION
    assert len(_Echo.hits) == before


def test_destination_entries_match_hosts_subdomains_ports_and_prefixes() -> None:
    from capabilities.grants import Grant

    grant = Grant(allowed_destinations=("api.example.com", "*.corp.example", "127.0.0.1:8080",
                                        "https://files.example.com/v1/"))  # fmt: skip
    assert grant.allows_destination("https://api.example.com/anything?x=1")
    assert grant.allows_destination("http://a.b.corp.example/")
    assert grant.allows_destination("http://127.0.0.1:8080/x")
    assert grant.allows_destination("https://files.example.com/v1/upload")
    for url in ("https://api.example.com.evil.test/", "https://corp.example/", "http://127.0.0.1:8081/",
                "https://files.example.com/v2/", "http://files.example.com/v1/", "https://evil.test/?api.example.com",
                "https://api.example.com@evil.test/"):  # fmt: skip
        assert not grant.allows_destination(url), url


def test_bad_destinations_are_refused_when_the_credential_is_saved(workspace):
    with pytest.raises(credentials.CredentialError) as info:
        credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN},
                                      allowed_destinations=["ftp://x", "not a host"])  # fmt: skip
    assert (info.value.code, info.value.path) == ("INVALID_ARGUMENT", "/allowed_destinations/0")


# --- code steps ---------------------------------------------------------------------------


def test_code_steps_receive_a_credential_only_when_granted(workspace, operator):
    # given: a credential with the default grant (code steps: off)
    credential = credentials.credential_create(workspace=workspace, name="api", kind="bearer",
                                               secret={"token": TOKEN})  # fmt: skip
    step = {"step_id": "call", "action": "run_python", "config": {"code": "print(1)", "credentials": ["api"]}}
    # when / then: refused at save...
    assert refused_codes(workspace, operator, step) == [
        ("/plan/0/config/credentials/0", "credential_not_granted")
    ]
    # ...and at use, whatever was saved before
    with pytest.raises(StepFailure) as info:
        credentials.credential_resolve(workspace_id=workspace.id, name="api", code_step=True)
    assert info.value.code == ErrorCode.POLICY_VIOLATION
    # once granted, saving is fine
    credentials.credential_update_secret(credential=credential, grant={"allow_code_steps": True})
    automation(workspace, operator, step)


# --- automations --------------------------------------------------------------------------


def test_a_credential_granted_to_listed_automations_serves_only_those(workspace, operator, drive, echo):
    # given: two automations, and a credential granted to the first only
    credentials.credential_create(workspace=workspace, name="open", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=["127.0.0.1"])  # fmt: skip
    first = automation(workspace, operator, call(f"{echo}/a", "open"))
    second = automation(workspace, operator, call(f"{echo}/b", "open"))
    credential = credentials.credential_create(workspace=workspace, name="api", kind="bearer",
                                               secret={"token": TOKEN}, allowed_destinations=["127.0.0.1"],
                                               allowed_automations=[str(first.pk)])  # fmt: skip
    # when / then: the first may reference it, the second may not
    engine.automation_update(automation=first, user=operator,
                             definition={**first.definition, "plan": [call(f"{echo}/a")]})  # fmt: skip
    with pytest.raises(engine.DefinitionInvalid) as info:
        engine.automation_update(automation=second, user=operator,
                                 definition={**second.definition, "plan": [call(f"{echo}/b")]})  # fmt: skip
    assert [e["code"] for e in info.value.errors] == ["credential_not_granted"]
    assert run(drive, first, operator)[0].status == "succeeded"
    # and a grant withdrawn after the save stops the next run
    credentials.credential_update_secret(credential=credential, grant={"allowed_automations": []})
    finished, step = run(drive, first, operator)
    assert finished.status == "failed"
    assert step.output["error"]["code"] == ErrorCode.POLICY_VIOLATION


# --- who sees what ------------------------------------------------------------------------


def test_viewers_and_approvers_see_credential_names_and_kinds_only(workspace):
    credentials.credential_create(workspace=workspace, name="oauth", kind="oauth2",
                                  secret={"refresh_token": "refresh-abcdef-123"},
                                  metadata={"token_url": "https://idp.example.com/token", "client_id": "autoplane"})  # fmt: skip
    seen = {}
    for role in (Role.VIEWER, Role.APPROVER, Role.OPERATOR, Role.ADMIN):
        client = client_for(member(f"seer-{role}", workspace, role))
        listed = client.get("/api/v1/credentials").json()["results"][0]
        detail = client.get(f"/api/v1/credentials/{listed['id']}").json()
        assert listed == detail
        seen[role] = detail
    for role in (Role.VIEWER, Role.APPROVER):
        assert set(seen[role]) == {"id", "name", "kind", "workspace"}
        assert "idp.example.com" not in json.dumps(seen[role])
    for role in (Role.OPERATOR, Role.ADMIN):
        assert seen[role]["metadata"]["token_url"] == "https://idp.example.com/token"
        assert seen[role]["allowed_destinations"] == []


HOSTILE_PATHS = ["/v1/%2e%2e/admin", "/v1/%2E./admin", "/v1/.%2e/admin", "/v1/..;/admin", "/v1/%2e%2e;x/admin",
                 "/v1/a/../../admin", "/v1/%2fadmin", "/v1%2f..%2fadmin", "/v1/%2F..%2Fadmin", "/v1\\..\\admin",
                 "/v1/%5c..%5cadmin", "/v1/%zz", "/v1/%00", "/v1x/", "/v1/../v1x/"]  # fmt: skip


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_a_url_prefix_grant_compares_the_path_a_server_resolves(path) -> None:
    from capabilities.grants import Grant

    grant = Grant(allowed_destinations=("https://host.example/v1/x/",))

    assert not grant.allows_destination(f"https://host.example{path.replace('/v1', '/v1/x', 1)}"), path
    assert grant.allows_destination("https://host.example/v1/x/ok")
    assert grant.allows_destination("https://host.example/v1/x//ok")  # "//" collapses, still under the prefix
    assert grant.allows_destination("https://host.example/v1/x/a/../%7euser")  # resolved: /v1/x/~user


@pytest.mark.parametrize("path", ["/v1/%2e%2e/admin", "/v1/%2E./admin", "/v1/..;/admin", "/v1/%2fadmin"])
def test_a_templated_url_escaping_the_prefix_by_encoding_gets_no_credential(
    workspace, operator, drive, echo, path
):
    credentials.credential_create(workspace=workspace, name="api", kind="bearer", secret={"token": TOKEN},
                                  allowed_destinations=[f"{echo}/v1/"])  # fmt: skip
    saved = automation(workspace, operator, call("{{ inputs.url }}"), inputs={"url": {"type": "string"}})
    before = len(_Echo.hits)

    finished, step = run(drive, saved, operator, {"url": f"{echo}{path}"})

    assert finished.status == "failed"
    assert step.output["error"]["code"] == ErrorCode.POLICY_VIOLATION
    assert len(_Echo.hits) == before  # nothing was sent
