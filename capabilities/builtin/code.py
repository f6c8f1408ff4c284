"""``run_python`` and ``run_shell``: the user's code in the sandbox (SPEC §8, docs/sandbox.md).

The code, its ``files`` and ``input.json`` are written into a fresh per-run
``/workspace``; ``input`` also arrives as JSON on stdin. Python runs as
``python3 -B -E -s -u main.py ARGS`` (the sandbox's own interpreter: the host's
``/usr``, none of the project's packages), a shell script as ``/bin/sh
script.sh ARGS`` -- argv lists, so user text never reaches a host shell.

Declared ``credentials`` are resolved at call time (so the engine redacts their
values from everything it stores) and become environment variables inside the
sandbox only: ``AUTOPLANE_CRED_<NAME>`` (bearer / oauth2 token, header value),
``..._USERNAME`` / ``..._PASSWORD`` (basic), ``..._HEADER_NAME`` (header). They
travel in a workspace file that a fixed loader sources and deletes, never on a
command line, where any user of the worker host could read them.

Result: the last non-empty stdout line, if it is JSON, is the step's ``data``;
otherwise ``data`` is the stdout text. ``SandboxResult.error_code`` becomes the
step's code:

* ``TIMEOUT`` -- wall clock or CPU-seconds limit (retryable only without network:
  a rerun then has no external effect);
* ``SANDBOX_VIOLATION`` -- memory, file size, processes, open files, output flood,
  a sandbox that failed to start, or no sandbox at all (fail closed: never run
  unsandboxed);
* ``INVALID_ARGUMENT`` -- the code exited non-zero or was killed by a signal.

Failure messages are generic ("the script exited with status 1"); the failed
envelope's ``data`` carries the exit status and the tails of stdout/stderr (the
user's own output, redacted like everything else).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import signal
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from .. import sandbox
from ..base import (
    ActionContext,
    ActionDefinition,
    Capability,
    Envelope,
    ErrorCode,
    Risk,
    RiskInputs,
    SideEffect,
    StepFailure,
)

logger = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
MAX_CODE_BYTES = 64 * KiB
MAX_FILES = 20
MAX_FILES_BYTES = MiB
MAX_INPUT_BYTES = 4 * MiB
MAX_ARGS = 100
MAX_CREDENTIALS = 10
MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS = 1, 3600
DEFAULT_TIMEOUT_SECONDS = 30.0
MIN_MEMORY_MB, MAX_MEMORY_MB, DEFAULT_MEMORY_MB = 16, 4096, 256
# What a code step with no declared duration is expected to take: it routes to
# automations_fast. The 30 s default timeout is a safety net, not an estimate
# (docs/sandbox.md, "Which pool runs a code step").
DEFAULT_EXPECTED_SECONDS = 5.0
MAX_OUTPUT_BYTES = MiB
STDOUT_TAIL_CHARS, STDERR_TAIL_CHARS = 2000, 4000
MAX_RESULT_DEPTH = 64

PYTHON = "python3"
# -B: no .pyc in the workspace; -E: ignore PYTHON* variables; -s: no user site; -u: unbuffered,
# so output printed before a timeout or a kill is not lost. Not -I: its -P would take the
# workspace off sys.path and a script could not import its own ``files``.
PYTHON_FLAGS = ("-B", "-E", "-s", "-u")
INPUT_FILE, PYTHON_MAIN, SHELL_MAIN = "input.json", "main.py", "script.sh"
CREDENTIALS_FILE = ".autoplane-env"  # FILE_NAME cannot start with a dot: no clash with ``files``
# A constant: the only text we hand to ``sh -c``. It exports the variables the
# file assigns, deletes the file and replaces itself with the step's argv.
_LOADER = f'set -a; . ./{CREDENTIALS_FILE}; set +a; rm -f ./{CREDENTIALS_FILE}; exec "$@"'
ENV_PREFIX = "AUTOPLANE_CRED_"

_SEGMENT = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
FILE_NAME = f"^{_SEGMENT}(/{_SEGMENT}){{0,7}}$"  # relative, no "..", no hidden files
_TEMPLATE_MARKERS = ("{{", "{%", "{#")

_LIMITS: dict[str, Any] = {
    "args": {
        "type": "array",
        "maxItems": MAX_ARGS,
        # Numbers too: a template that is one expression ("{{ totals.n }}") keeps its type.
        "items": {"type": ["string", "number"], "maxLength": 8192},
        "description": "Command-line arguments (sys.argv[1:] / $1...); argv, never parsed by a shell.",
    },
    "input": {"description": "Any JSON: sent as JSON on stdin and written to /workspace/input.json."},
    "timeout_seconds": {
        "type": "number",
        "minimum": MIN_TIMEOUT_SECONDS,
        "maximum": MAX_TIMEOUT_SECONDS,
        "description": "Wall-clock limit (default: the step's timeout_seconds, else 30).",
    },
    "memory_mb": {"type": "integer", "minimum": MIN_MEMORY_MB, "maximum": MAX_MEMORY_MB},
    "network": {
        "enum": ["none", "allow"],
        "description": "'allow' shares the worker's network (loopback included): high risk, gated.",
    },
    "files": {
        "type": "object",
        "maxProperties": MAX_FILES,
        "propertyNames": {"pattern": FILE_NAME, "maxLength": 255},
        "additionalProperties": {"type": "string"},
        "description": "Extra workspace files: relative name -> text (at most 20, 1 MB in all).",
    },
    "credentials": {
        "type": "array",
        "maxItems": MAX_CREDENTIALS,
        "uniqueItems": True,
        "items": {"type": "string", "minLength": 1, "maxLength": 100},
        "description": "Credential names, exposed inside the sandbox as AUTOPLANE_CRED_<NAME> variables.",
    },
}

PYTHON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Exactly one of `code` (the program) or `script` (a file name among `files`).",
    "properties": {
        "code": {"type": "string", "minLength": 1, "maxLength": MAX_CODE_BYTES},
        "script": {"type": "string", "pattern": FILE_NAME, "maxLength": 255},
        **_LIMITS,
    },
}

SHELL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["script"],
    "additionalProperties": False,
    "properties": {
        "script": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_CODE_BYTES,
            "description": "A POSIX sh script, run as /bin/sh script.sh ARGS inside the sandbox.",
        },
        **_LIMITS,
    },
}


# --- describing ---------------------------------------------------------------------------


def describe(config: Mapping[str, Any], *, kind: str) -> Capability:
    # Without network the code can touch nothing but its own throw-away workspace, so a
    # rerun has no external effect. A templated ``network`` is described as the worst case.
    sealed = config.get("network", "none") == "none"
    timeout = config.get("timeout_seconds")
    if timeout is None:
        expected = DEFAULT_EXPECTED_SECONDS
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        expected = float(timeout)  # the author said how long it may take: route by that
    else:
        expected = float(MAX_TIMEOUT_SECONDS)  # templated
    return Capability(
        id=kind,
        description="code in the sandbox" + ("" if sealed else " with network access"),
        side_effects=frozenset() if sealed else frozenset({SideEffect.EXTERNAL_WRITE}),
        risk=Risk.LOW if sealed else Risk.HIGH,
        idempotent=sealed,
        expected_duration_seconds=expected,
    )


# --- checks beyond the schema ---------------------------------------------------------------


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and any(marker in value for marker in _TEMPLATE_MARKERS)


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def env_name(credential: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", credential.upper())


def _problems(config: Mapping[str, Any], kind: str, *, saving: bool) -> list[tuple[str, str, str]]:
    """(json-pointer suffix, code, message) for what the schema cannot say.

    ``saving``: the config is unrendered; a templated value is checked once rendered.
    """
    problems: list[tuple[str, str, str]] = []
    files: Mapping[str, Any] = config["files"] if isinstance(config.get("files"), Mapping) else {}
    if kind == "run_python":
        code_pointer, main = "/code", PYTHON_MAIN if "code" in config else None
        if ("code" in config) == ("script" in config):
            problems.append(
                ("", "invalid_config", "give either `code` or `script` (a file name among `files`)")
            )
        elif "script" in config and not _is_template(config["script"]) and config["script"] not in files:
            problems.append(("/script", "invalid_config", f"'{config['script']}' is not one of `files`"))
    else:
        code_pointer, main = "/script", SHELL_MAIN
    for reserved in (INPUT_FILE, main):
        if reserved in files:
            problems.append(("/files", "invalid_config", f"'{reserved}' is reserved: the platform writes it"))

    code = config.get(code_pointer[1:])
    if isinstance(code, str) and _utf8_size(code) > MAX_CODE_BYTES:
        problems.append((code_pointer, "too_large", f"at most {MAX_CODE_BYTES // KiB} KB of code"))
    if sum(_utf8_size(text) for text in files.values() if isinstance(text, str)) > MAX_FILES_BYTES:
        problems.append(("/files", "too_large", f"at most {MAX_FILES_BYTES // MiB} MB of files in all"))
    if saving:
        # Every config string is a template; code must not be one (a value rendered into
        # code is code injection), and Jinja would mangle code that merely looks like one.
        sources = {code_pointer: code} if kind == "run_shell" or "code" in config else {}
        sources.update(
            {"/files/" + name.replace("~", "~0").replace("/", "~1"): text for name, text in files.items()}
        )
        for pointer, text in sources.items():
            if _is_template(text):
                problems.append((pointer, "template_in_code", (
                    "code is not a template: pass values in `input` (JSON on stdin) or `args`; "
                    "to write a literal '{{', '{%' or '{#', split it (e.g. '{' '{')"
                )))  # fmt: skip

    args: list[Any] = config["args"] if isinstance(config.get("args"), list) else []
    for i, arg in enumerate(args):
        if isinstance(arg, str) and "\0" in arg:
            problems.append((f"/args/{i}", "invalid_config", "arguments cannot contain NUL characters"))
    names: list[Any] = config["credentials"] if isinstance(config.get("credentials"), list) else []
    seen: dict[str, str] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or _is_template(name):
            continue
        variable = env_name(name)
        if variable in seen:
            problems.append((f"/credentials/{i}", "invalid_config",
                             f"'{name}' and '{seen[variable]}' would both be {variable}"))  # fmt: skip
        seen[variable] = name
    return problems


def _validate_python(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return _problems(config, "run_python", saving=True)


def _validate_shell(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return _problems(config, "run_shell", saving=True)


# --- running ------------------------------------------------------------------------------


def _credential_env(ctx: ActionContext, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    if ctx.resolve_credential is None:
        raise StepFailure(ErrorCode.INTERNAL, "credentials cannot be resolved here")
    env: dict[str, str] = {}
    for name in names:
        value = ctx.resolve_credential(name, code_step=True)  # checks the grant; registers values to redact
        if not isinstance(value, Mapping):
            raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"no credential named '{name}'")
        base, kind = env_name(name), value.get("kind")
        if kind in ("bearer", "oauth2") and value.get("token"):
            fields = {base: value["token"]}
        elif kind == "basic":
            fields = {f"{base}_USERNAME": value.get("username"), f"{base}_PASSWORD": value.get("password")}
        elif kind == "header":
            fields = {base: value.get("value"), f"{base}_HEADER_NAME": value.get("header_name")}
        else:
            raise StepFailure(
                ErrorCode.INVALID_ARGUMENT, f"credential '{name}' cannot be used by a code step"
            )
        for key, text in fields.items():
            if not isinstance(text, str) or "\0" in text:
                raise StepFailure(
                    ErrorCode.INVALID_ARGUMENT, f"credential '{name}' cannot be used by a code step"
                )
            env[key] = text
    return env


def _encode_input(value: Any) -> bytes:
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, "input is not valid JSON")
    if len(encoded) > MAX_INPUT_BYTES:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"input is larger than {MAX_INPUT_BYTES // MiB} MB")
    return encoded


def build_request(ctx: ActionContext, config: Mapping[str, Any], kind: str) -> sandbox.SandboxRequest:
    """The sandbox request for a rendered, schema-valid config (raises StepFailure)."""
    problems = _problems(config, kind, saving=False)
    if problems:
        pointer, _code, message = problems[0]
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"config{pointer}: {message}", retryable=False)
    stdin = _encode_input(config.get("input"))
    files: dict[str, bytes | str] = {**(config.get("files") or {}), INPUT_FILE: stdin}
    args = [arg if isinstance(arg, str) else json.dumps(arg) for arg in config.get("args") or []]
    if kind == "run_python":
        if "code" in config:
            files[PYTHON_MAIN] = config["code"]
        argv = [PYTHON, *PYTHON_FLAGS, config.get("script", PYTHON_MAIN), *args]
    else:
        files[SHELL_MAIN] = config["script"]
        argv = ["/bin/sh", SHELL_MAIN, *args]
    env = _credential_env(ctx, list(config.get("credentials") or []))
    if env:
        files[CREDENTIALS_FILE] = "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())
        argv = ["/bin/sh", "-c", _LOADER, "autoplane-env", *argv]
    # The config may ask for less time than the step has, never more (ctx carries the
    # step's timeout and whatever is left of the run's).
    timeout = min(float(config.get("timeout_seconds", ctx.timeout_seconds)), ctx.timeout_seconds)
    return sandbox.SandboxRequest(
        argv=argv,
        files=files,
        stdin=stdin,
        timeout_seconds=max(timeout, 0.1),
        memory_mb=int(config.get("memory_mb", DEFAULT_MEMORY_MB)),
        network=config.get("network", "none") == "allow",
        max_output_bytes=MAX_OUTPUT_BYTES,
        cancelled=ctx.cancelled,
    )


def _run(ctx: ActionContext, config: Mapping[str, Any], kind: str) -> Envelope:
    request = build_request(ctx, config, kind)
    if request.network and not settings.AUTOPLANE_SANDBOX_ALLOW_NETWORK:
        # A granted network is the worker's own, loopback included (the database and
        # broker): only a deployment that has isolated its workers may turn it on.
        return Envelope.failure(
            ErrorCode.SANDBOX_VIOLATION,
            "network access for sandboxed code is disabled on this platform (AUTOPLANE_SANDBOX_ALLOW_NETWORK)",
            retryable=False,
        )
    try:
        result = sandbox.run_sandboxed(request)
    except sandbox.SandboxUnavailable as exc:
        logger.error("run %s step %s: %s", ctx.run_id, ctx.step_id, exc)
        return Envelope.failure(
            ErrorCode.SANDBOX_VIOLATION, "the sandbox is unavailable; the step was not run", retryable=False
        )
    logger.info(
        "run %s step %s: %s in %.0f ms (code=%s violation=%s)",
        ctx.run_id, ctx.step_id, kind, result.duration_seconds * 1000, result.error_code, result.violation,
    )  # fmt: skip
    if result.violation == "cancelled":
        return Envelope.failure(
            ErrorCode.CANCELLED,
            f"the run was cancelled: the sandbox process group was killed after {result.duration_seconds:.1f}s",
            retryable=False,
        )
    return to_envelope(result, request, network=request.network)


# --- results ------------------------------------------------------------------------------


def _text(raw: bytes) -> str:
    # PostgreSQL's jsonb cannot hold NUL characters.
    return raw.decode("utf-8", errors="replace").replace("\0", "\ufffd")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\0", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_result(stdout: str, truncated: bool) -> Any:
    """The last non-empty line as JSON if it is JSON, else the whole text (``None`` if empty)."""
    text = stdout.rstrip("\n")
    if not text.strip():
        return None
    if not truncated:  # a cut-off stream's last line is not what the code meant to return
        last = next(line for line in reversed(text.splitlines()) if line.strip())
        try:
            value = json.loads(last, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            pass
        else:
            if _depth(value) <= MAX_RESULT_DEPTH:
                return _without_nul(value)
    return text


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failure_message(result: sandbox.SandboxResult, request: sandbox.SandboxRequest) -> str:
    limits = {
        "wall_time": f"the script ran longer than its {request.timeout_seconds:g} s timeout and was stopped",
        "cpu_time": "the script used more CPU time than its timeout allows and was stopped",
        "memory": f"the script ran out of memory (limit {request.memory_mb} MB)",
        "file_size": f"the script tried to write a file larger than {request.max_file_bytes // MiB} MB",
        "processes": f"the script tried to start too many processes (limit {request.max_processes})",
        "open_files": f"the script opened too many files (limit {request.max_open_files})",
        "output": f"the script printed more than {2 * request.max_output_bytes // MiB} MB and was stopped",
        "sandbox_setup": "the sandbox could not be set up; the step was not run",
    }
    if result.violation in limits:
        return limits[result.violation]
    if result.exit_code is not None and result.exit_code <= 128:
        return f"the script exited with status {result.exit_code}"
    if result.signal is not None:
        return f"the script was killed by {_signal_name(result.signal)}"
    return "the script failed"


def _tail(raw: bytes, chars: int) -> str:
    text = _text(raw)
    return text[-chars:]


def to_envelope(result: sandbox.SandboxResult, request: sandbox.SandboxRequest, *, network: bool) -> Envelope:
    stdout = _text(result.stdout)
    duration_ms = round(result.duration_seconds * 1000)
    notes = [f"{label} truncated at {request.max_output_bytes // MiB} MB"
             for label, cut in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)) if cut]  # fmt: skip
    if result.ok:
        summary = f"exited 0 in {duration_ms} ms" + (f" ({'; '.join(notes)})" if notes else "")
        return Envelope.success(parse_result(stdout, result.stdout_truncated), summary=summary)
    code = result.error_code or ErrorCode.INTERNAL
    # Re-running a sealed step repeats nothing outside it; with network it might.
    retryable = code == ErrorCode.TIMEOUT and not network
    envelope = Envelope.failure(code, _failure_message(result, request), retryable=retryable)
    envelope.data = {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "violation": result.violation,
        "duration_ms": duration_ms,
        "stdout_tail": _tail(result.stdout, STDOUT_TAIL_CHARS),
        "stderr_tail": _tail(result.stderr, STDERR_TAIL_CHARS),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
    }
    return envelope


# --- the actions --------------------------------------------------------------------------


def _python_handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    return _run(ctx, config, "run_python")


def _shell_handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    return _run(ctx, config, "run_shell")


def _describe_python(config: Mapping[str, Any]) -> Capability:
    return describe(config, kind="run_python")


def _describe_shell(config: Mapping[str, Any]) -> Capability:
    return describe(config, kind="run_shell")


def _risk_inputs(config: Mapping[str, Any]) -> RiskInputs:
    return RiskInputs(network=config.get("network") == "allow")


RUN_PYTHON = ActionDefinition(
    name="run_python",
    description=(
        "Run Python 3 code in the sandbox (no network unless granted, no platform files). "
        "`input` arrives as JSON on stdin and in input.json; the last stdout line, if JSON, is the result."
    ),
    config_schema=PYTHON_SCHEMA,
    describe=_describe_python,
    handler=_python_handler,
    validate=_validate_python,
    risk_inputs=_risk_inputs,
    credentials_to_code=True,
)

RUN_SHELL = ActionDefinition(
    name="run_shell",
    description=(
        "Run a POSIX sh script in the sandbox (no network unless granted, no platform files). "
        "`input` arrives as JSON on stdin and in input.json; the last stdout line, if JSON, is the result."
    ),
    config_schema=SHELL_SCHEMA,
    describe=_describe_shell,
    handler=_shell_handler,
    validate=_validate_shell,
    risk_inputs=_risk_inputs,
    credentials_to_code=True,
)
