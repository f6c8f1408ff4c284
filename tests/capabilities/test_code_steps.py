"""``run_python`` / ``run_shell`` as steps of real runs: data in and out, credentials,
validation at save time, risk, and which queue a code step's run goes to.

Runs are created with the services and driven in-process by the real executor;
the code runs in real bubblewrap (tests that need it skip where it cannot start).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

from audit.models import AuditEvent
from automations import executor
from automations.models import Run, RunStatus, StepRun
from automations.services import DefinitionInvalid, automation_create, run_create
from capabilities.base import ActionContext, Risk, SideEffect
from capabilities.builtin import code
from capabilities.credentials import credential_create
from capabilities.sandbox import BubblewrapBackend
from config.celery import QUEUE_FAST, QUEUE_LONG, QUEUE_MEDIUM
from tests.factories import definition
from workspaces.models import Workspace

BWRAP_AVAILABLE = BubblewrapBackend().available()


@pytest.fixture
def sandbox():
    if not BWRAP_AVAILABLE:
        pytest.skip("bubblewrap cannot start a sandbox here (apt-get install bubblewrap; user namespaces)")


def python(step_id: str, source: str, **extra) -> dict:
    config = {"code": source, **extra.pop("config", {})}
    return {"step_id": step_id, "action": "run_python", "config": config, **extra}


def shell(step_id: str, script: str, **extra) -> dict:
    config = {"script": script, **extra.pop("config", {})}
    return {"step_id": step_id, "action": "run_shell", "config": config, **extra}


def start(workspace, *steps, given=None, **body) -> Run:
    """Save an automation of ``steps`` (``body``: more definition fields) and dispatch a run with ``given`` inputs."""
    automation = automation_create(workspace=workspace, definition=definition(*steps, **body))
    return run_create(automation=automation, inputs=given or {}).run


def run_to_rest(workspace, *steps, given=None, **body) -> Run:
    run = start(workspace, *steps, given=given, **body)
    executor.execute_run(str(run.pk))
    return Run.objects.get(pk=run.pk)


def step_of(run: Run, step_id: str) -> StepRun:
    return StepRun.objects.get(run=run, step_id=step_id)


# --- data in, data out ------------------------------------------------------------------------


def test_python_step_gets_rendered_input_and_its_json_result_feeds_the_next_step(workspace, sandbox):
    source = """
import json, sys
data = json.load(sys.stdin)
same = json.load(open("input.json")) == data
print("computing...")  # log lines before the result are fine
print(json.dumps({"doubled": data["x"] * 2, "count": len(data["items"]), "same_file": same}))
"""
    follow_up = """
import json, sys
previous = json.load(sys.stdin)
print(json.dumps({"total": previous["doubled"] + previous["count"], "argv": sys.argv[1:]}))
"""
    inputs_schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}

    run = run_to_rest(
        workspace,
        python(
            "calc", source, config={"input": {"x": "{{ inputs.x }}", "items": [1, 2, 3]}}, output_as="calc"
        ),
        python("use", follow_up, config={"input": "{{ calc }}", "args": ["{{ calc.doubled }}"]}),
        given={"x": 21},
        inputs={"schema": inputs_schema},
    )

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert step_of(run, "calc").output["data"] == {"doubled": 42, "count": 3, "same_file": True}
    assert run.context["calc"] == {"doubled": 42, "count": 3, "same_file": True}
    assert run.output == {"total": 45, "argv": ["42"]}
    assert step_of(run, "calc").output["summary"].startswith("exited 0 in ")


def test_stdout_that_does_not_end_in_json_is_the_result_as_text(workspace, sandbox):
    run = run_to_rest(workspace, python("hello", "print('hello')\nprint('world')"))

    assert run.status == RunStatus.SUCCEEDED
    assert run.output == "hello\nworld"


def test_shell_step_gets_args_as_argv_never_through_a_shell(workspace, sandbox):
    hostile = ["two words", "$(touch pwned)", "; echo injected", "`id`"]
    script = 'for arg in "$@"; do printf "%s\\n" "$arg"; done\nls\n'

    run = run_to_rest(workspace, shell("args", script, config={"args": hostile}))

    assert run.status == RunStatus.SUCCEEDED, run.error
    printed = run.output.splitlines()
    assert printed[:4] == hostile
    assert "pwned" not in printed  # the workspace listing: nothing was executed
    assert "injected" not in printed


def test_python_script_from_files_can_import_its_sibling_modules(workspace, sandbox):
    files = {"app/main.py": "import helpers\nhelpers.report()\n",
             "app/helpers.py": "import json, sys\ndef report():\n    print(json.dumps(sys.argv[1:]))\n"}  # fmt: skip
    step = {"step_id": "app", "action": "run_python",
            "config": {"script": "app/main.py", "files": files, "args": ["a", "b"]}}  # fmt: skip

    run = run_to_rest(workspace, step)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == ["a", "b"]


def test_failing_script_reports_its_exit_status_and_keeps_its_stderr_tail(workspace, sandbox):
    source = "import sys\nprint('partial work')\nprint('bad row 17', file=sys.stderr)\nsys.exit(3)"

    run = run_to_rest(workspace, python("broken", source))

    failed = step_of(run, "broken")
    assert run.status == RunStatus.FAILED
    assert run.error == {
        "code": "INVALID_ARGUMENT",
        "message": "the script exited with status 3",
        "step_id": "broken",
    }
    assert (failed.error_code, failed.error_message) == (
        "INVALID_ARGUMENT",
        "the script exited with status 3",
    )
    assert failed.output["data"]["exit_code"] == 3
    assert failed.output["data"]["stderr_tail"] == "bad row 17\n"
    assert failed.output["data"]["stdout_tail"] == "partial work\n"


def test_uncaught_exception_in_shell_step_is_reported_as_its_exit_status(workspace, sandbox):
    run = run_to_rest(workspace, shell("sh", "echo nope >&2\nexit 42"))

    assert run.error["code"] == "INVALID_ARGUMENT"
    assert run.error["message"] == "the script exited with status 42"
    assert step_of(run, "sh").output["data"]["stderr_tail"] == "nope\n"


# --- credentials --------------------------------------------------------------------------


@pytest.fixture
def credentials(workspace):
    token = "sk_live_" + "7" * 24
    password = "pa'ss\"word $HOME `id`"  # shell metacharacters must arrive verbatim
    credential_create(workspace=workspace, name="shop-api", kind="bearer", secret={"token": token},
                      allow_code_steps=True)  # fmt: skip
    credential_create(workspace=workspace, name="db_login", kind="basic",
                      secret={"username": "reporter", "password": password}, allow_code_steps=True)  # fmt: skip
    return {"token": token, "password": password}


def _cmdlines_containing(needle: bytes) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    found.append(proc.name)
            except OSError:
                pass
    return found


def test_credentials_are_visible_inside_only_and_never_stored(workspace, sandbox, credentials):
    source = """
import hashlib, json, os, time
time.sleep(0.5)  # long enough for the test to look at every command line on the host
names = ["AUTOPLANE_CRED_SHOP_API", "AUTOPLANE_CRED_DB_LOGIN_USERNAME", "AUTOPLANE_CRED_DB_LOGIN_PASSWORD"]
print(os.environ["AUTOPLANE_CRED_SHOP_API"])  # a careless print: redacted before it is stored
print(json.dumps({
    "sha256": {name: hashlib.sha256(os.environ[name].encode()).hexdigest() for name in names},
    "echo": os.environ["AUTOPLANE_CRED_SHOP_API"],
    "workspace": sorted(os.listdir(".")),
}))
"""
    step = python("use", source, config={"credentials": ["shop-api", "db_login"]}, output_as="used")
    leaked_cmdlines: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            leaked_cmdlines.extend(_cmdlines_containing(credentials["token"].encode()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = run_to_rest(workspace, step)
    finally:
        stop.set()
        watcher.join()

    assert run.status == RunStatus.SUCCEEDED, run.error
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731
    assert run.output["sha256"] == {
        "AUTOPLANE_CRED_SHOP_API": digest(credentials["token"]),
        "AUTOPLANE_CRED_DB_LOGIN_USERNAME": digest("reporter"),
        "AUTOPLANE_CRED_DB_LOGIN_PASSWORD": digest(credentials["password"]),
    }
    assert run.output["echo"] == "[REDACTED]"
    assert run.output["workspace"] == ["input.json", "main.py"]  # the loader removed its file
    assert leaked_cmdlines == []  # never on a host command line
    stored = json.dumps([
        list(StepRun.objects.filter(run=run).values("output", "rendered_config", "error_message")),
        list(Run.objects.filter(pk=run.pk).values("output", "context", "error")),
        list(AuditEvent.objects.values("summary", "payload")),
    ], default=str)  # fmt: skip
    assert credentials["token"] not in stored
    assert credentials["password"] not in stored


def test_credentials_with_clashing_variable_names_are_refused_at_save(workspace, credentials):
    credential_create(workspace=workspace, name="shop_api", kind="bearer", secret={"token": "other-token-1"},
                      allow_code_steps=True)  # fmt: skip
    step = python("use", "print(1)", config={"credentials": ["shop-api", "shop_api"]})

    with pytest.raises(DefinitionInvalid) as raised:
        automation_create(workspace=workspace, definition=definition(step))

    assert {"path": "/plan/0/config/credentials/1", "code": "invalid_config",
            "message": "'shop_api' and 'shop-api' would both be AUTOPLANE_CRED_SHOP_API"} in raised.value.errors  # fmt: skip


# --- validation at save time ----------------------------------------------------------------

INVALID = [
    ("code and script", {"code": "print(1)", "script": "a.py", "files": {"a.py": ""}}, "", "invalid_config"),
    ("neither code nor script", {"args": []}, "", "invalid_config"),
    ("script not among files", {"script": "a.py"}, "/script", "invalid_config"),
    ("reserved file name", {"code": "print(1)", "files": {"input.json": "{}"}}, "/files", "invalid_config"),
    ("main.py taken by code", {"code": "print(1)", "files": {"main.py": ""}}, "/files", "invalid_config"),
    ("parent directory in a file name", {"code": "1", "files": {"../x.py": ""}}, "/files", "schema_violation"),
    ("absolute file name", {"code": "1", "files": {"/etc/x": ""}}, "/files", "schema_violation"),
    ("hidden file", {"code": "1", "files": {".env": ""}}, "/files", "schema_violation"),
    ("too many files", {"code": "1", "files": {f"f{i}.txt": "" for i in range(21)}}, "/files", "schema_violation"),
    # (Files over 1 MB: the definition's own 512 KB cap, checked first on every save, refuses them at "/";
    # tests/automations/test_definition_size.py.)
    ("code over 64 KB", {"code": "#" * (64 * 1024 + 1)}, "/code", "schema_violation"),
    ("multi-byte code over 64 KB", {"code": "é" * (40 * 1024)}, "/code", "too_large"),
    ("template in code", {"code": "print('{{ inputs.x }}')"}, "/code", "template_in_code"),
    ("template in a file", {"code": "1", "files": {"a.py": "{% raw %}x{% endraw %}"}}, "/files/a.py",
     "template_in_code"),
    ("zero timeout", {"code": "1", "timeout_seconds": 0}, "/timeout_seconds", "schema_violation"),
    ("timeout over an hour", {"code": "1", "timeout_seconds": 3601}, "/timeout_seconds", "schema_violation"),
    ("too little memory", {"code": "1", "memory_mb": 8}, "/memory_mb", "schema_violation"),
    ("too much memory", {"code": "1", "memory_mb": 8192}, "/memory_mb", "schema_violation"),
    ("unknown network mode", {"code": "1", "network": "host"}, "/network", "schema_violation"),
    ("args not strings or numbers", {"code": "1", "args": [True]}, "/args/0", "schema_violation"),
    ("NUL in an argument", {"code": "1", "args": ["a\0b"]}, "/args/0", "invalid_config"),
    ("expected duration belongs on the step", {"code": "1", "expected_duration_seconds": 60}, "",
     "schema_violation"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "path", "code"), [case[1:] for case in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_python_config_is_refused_at_save_with_path_and_code(workspace, config, path, code):
    step = {"step_id": "s", "action": "run_python", "config": config}

    with pytest.raises(DefinitionInvalid) as raised:
        automation_create(workspace=workspace, definition=definition(step))

    assert (f"/plan/0/config{path}", code) in {(e["path"], e["code"]) for e in raised.value.errors}, (
        raised.value.errors
    )


def test_shell_script_that_looks_like_a_template_is_refused_at_save(workspace):
    step = shell("sh", 'name=abc\necho "${#name}"')  # "{#" would start a Jinja comment

    with pytest.raises(DefinitionInvalid) as raised:
        automation_create(workspace=workspace, definition=definition(step))

    assert "/plan/0/config/script" in {e["path"] for e in raised.value.errors}


def test_templated_values_are_allowed_where_they_are_data(workspace):
    step = python("s", "import sys; print(sys.argv)", config={
        "input": {"who": "{{ inputs.who }}"}, "args": ["{{ inputs.who }}"], "timeout_seconds": "{{ inputs.t }}",
    })  # fmt: skip

    automation = automation_create(workspace=workspace, definition=definition(step, inputs={"schema": {
        "type": "object", "properties": {"who": {"type": "string"}, "t": {"type": "integer"}}}}))  # fmt: skip

    assert automation.pk is not None


# --- risk ---------------------------------------------------------------------------------


def test_sealed_code_is_low_risk_idempotent_and_network_makes_it_a_high_risk_external_write():
    sealed = code.RUN_PYTHON.describe({"code": "1"})
    networked = code.RUN_SHELL.describe({"script": "curl example.com", "network": "allow"})
    templated = code.RUN_PYTHON.describe({"code": "1", "network": "{{ inputs.mode }}"})

    assert (sealed.risk, sealed.side_effects, sealed.idempotent) == (Risk.LOW, frozenset(), True)
    assert sealed.safe_to_retry
    assert (networked.risk, networked.idempotent) == (Risk.HIGH, False)
    assert networked.side_effects == {SideEffect.EXTERNAL_WRITE}
    assert templated.risk == Risk.HIGH  # unknown until rendered: the worst case


def test_networked_code_step_waits_for_approval_and_has_not_run(workspace, sandbox):
    run = run_to_rest(workspace, shell("fetch", "echo ran", config={"network": "allow"}))

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert step_of(run, "fetch").output is None


def test_granted_network_is_refused_unless_the_deployment_allows_it(workspace, sandbox, settings):
    Workspace.objects.filter(pk=workspace.pk).update(max_autonomy="A4")  # a networked step is high risk
    step = shell("fetch", "echo ran", config={"network": "allow"})
    run = run_to_rest(workspace, step, execution={"autonomy": "A4"})
    assert run.status == RunStatus.FAILED
    assert step_of(run, "fetch").error_code == "SANDBOX_VIOLATION"
    assert "AUTOPLANE_SANDBOX_ALLOW_NETWORK" in step_of(run, "fetch").error_message

    settings.AUTOPLANE_SANDBOX_ALLOW_NETWORK = True
    run = run_to_rest(workspace, step, execution={"autonomy": "A4"})
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == "ran"


# --- timeouts and routing -----------------------------------------------------------------


def _ctx(timeout: float) -> ActionContext:
    return ActionContext(run_id="r", step_id="s", attempt=1, workspace_id=1, trace_id="t", idempotency_key="k",
                         timeout_seconds=timeout)  # fmt: skip


@pytest.mark.parametrize(
    ("config_timeout", "step_timeout", "effective"),
    [(None, 30, 30), (None, 40, 40), (10, 40, 10), (100, 40, 40), (1800, 1800, 1800)],
)
def test_sandbox_timeout_is_the_config_timeout_capped_by_the_step(config_timeout, step_timeout, effective):
    config = {"code": "1"} if config_timeout is None else {"code": "1", "timeout_seconds": config_timeout}

    request = code.build_request(_ctx(step_timeout), config, "run_python")

    assert request.timeout_seconds == effective


def test_step_timeout_stops_code_that_asked_for_more(workspace, sandbox):
    started = time.monotonic()
    run = run_to_rest(workspace, python("slow", "import time; time.sleep(30)", timeout_seconds=1,
                                        config={"timeout_seconds": 600}))  # fmt: skip

    assert run.error["code"] == "TIMEOUT"
    assert run.error["message"] == "the script ran longer than its 1 s timeout and was stopped"
    assert time.monotonic() - started < 10


ROUTING = [
    ("default code step", {}, {}, QUEUE_FAST),
    ("declared duration on the step", {"expected_duration_seconds": 60}, {}, QUEUE_MEDIUM),
    ("long step timeout", {"timeout_seconds": 1800}, {}, QUEUE_LONG),
    ("long config timeout", {}, {"timeout_seconds": 1800}, QUEUE_LONG),
    ("20 s config timeout", {}, {"timeout_seconds": 20}, QUEUE_MEDIUM),
    ("short declared duration, long timeout", {"expected_duration_seconds": 5}, {"timeout_seconds": 1800},
     QUEUE_FAST),
    ("templated timeout", {}, {"timeout_seconds": "{{ inputs.t }}"}, QUEUE_LONG),
]  # fmt: skip


@pytest.mark.parametrize(
    ("step_fields", "config", "queue"), [c[1:] for c in ROUTING], ids=[c[0] for c in ROUTING]
)
def test_code_step_run_is_queued_by_its_declared_duration(workspace, step_fields, config, queue):
    step = python("s", "print(1)", config=config, **step_fields)

    run = start(workspace, step, given={"t": 5} if "{{" in str(config) else None)

    assert run.queue == queue
