"""What the platform adds to a draft and to an ``agent_task`` step, excluding the model.

A scripted OpenAI-compatible server on 127.0.0.1 (``tests/llm_server.py``)
answers instantly, so what is measured is the platform: building the
generator's context (schema, registry, resource names), validation, flags,
the HTTP round trips of the client, the draft row and its audit row — and for
``agent_task``, the executor, the tool gateway and the step's bookkeeping.
``draft_create`` also records ``usage.platform_ms`` (wall time minus time
inside model calls) on every draft.

Standalone, after ``manage.py migrate`` (any database)::

    uv run python bench/llm_bench.py --drafts 50 --runs 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--drafts", type=int, default=50)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from automations import executor, services
    from automations.authoring.drafts import draft_create
    from tests.llm_server import ScriptedLlmServer, reply_json, reply_text, reply_tool_call
    from workspaces.models import Role
    from workspaces.services import membership_set_role, workspace_get_or_create

    server = ScriptedLlmServer().start()
    settings.LLM_BASE_URL, settings.LLM_MODEL, settings.LLM_API_KEY = server.base_url, "bench", ""
    workspace = workspace_get_or_create(slug="bench-llm")
    user, _ = get_user_model().objects.get_or_create(username="bench-llm")
    membership_set_role(workspace=workspace, user=user, role=Role.OPERATOR)
    definition = {
        "schema_version": "1.0", "name": "bench digest",
        "triggers": [{"key": "daily", "type": "schedule", "config": {"cron": "0 9 * * 1-5"}}],
        "plan": [{"step_id": "post", "action": "http_request",
                  "config": {"method": "POST", "url": "https://hooks.example.com/x", "json": {"n": "{{ run.id }}"}}}],
    }  # fmt: skip
    review = {"summary": "Posts every weekday.", "flags": []}
    platform, total, outside = [], [], []
    for _ in range(args.drafts):
        server.script(reply_json(definition), reply_json(review))
        started = time.perf_counter()
        draft = draft_create(workspace=workspace, user=user, prompt="every weekday post to our hook")
        total.append((time.perf_counter() - started) * 1000)
        platform.append(draft.usage["platform_ms"])
        outside.append(
            total[-1] - draft.usage["model_ms"]
        )  # everything but the model calls, DB writes included
    print(f"draft (1 round + review, {args.drafts}x): wall p50 {_pct(total, 0.5):.1f} ms, "
          f"platform excl. model p50 {_pct(platform, 0.5):.1f} ms p95 {_pct(platform, 0.95):.1f} ms "
          f"mean {statistics.mean(platform):.1f} ms; with the draft and audit writes p50 {_pct(outside, 0.5):.1f} ms "
          f"p95 {_pct(outside, 0.95):.1f} ms")  # fmt: skip

    automation = services.automation_create(workspace=workspace, user=user, definition={
        "schema_version": "1.0", "name": f"bench agent {time.time()}",
        "plan": [{"step_id": "agent", "action": "agent_task",
                  "config": {"prompt": "go", "tools": ["core.echo"]}}]})  # fmt: skip
    durations = []
    for _ in range(args.runs):
        server.script(reply_tool_call("core_echo", {"x": 1}), reply_text("done"))
        run = services.run_create(automation=automation, inputs={}, user=user).run
        started = time.perf_counter()
        executor.execute_run(str(run.pk))
        durations.append((time.perf_counter() - started) * 1000)
    print(f"agent_task run (2 model calls + 1 tool call, {args.runs}x, in-process executor, model answers "
          f"instantly): p50 {_pct(durations, 0.5):.1f} ms p95 {_pct(durations, 0.95):.1f} ms")  # fmt: skip
    server.stop()


if __name__ == "__main__":
    main()
