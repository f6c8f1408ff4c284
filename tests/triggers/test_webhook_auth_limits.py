"""Failed webhook authentication is rate-limited per client address and per automation, and
rejections reach the ledger as a bounded number of rows per window (issue 12 §6)."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_all
from automations.models import Run
from tests.factories import fire
from triggers import rejections
from triggers.models import WebhookRejectionWindow

NOW = 1_800_000_000.0  # the start of a window whatever its length below


@pytest.fixture
def limits(settings, monkeypatch):
    settings.AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS = 60
    settings.AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_ADDRESS = 20
    settings.AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_AUTOMATION = 50
    settings.AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED = 5
    clock = {"now": NOW + 5}
    monkeypatch.setattr(rejections, "clock", lambda: clock["now"])
    return clock


def _rejections():
    return list(AuditEvent.objects.filter(type="webhook.rejected").order_by("id"))


def _bad(client, automation, address: str, n: int = 0):
    return fire(client, automation.pk, token=f"apt_wrong-{n}", REMOTE_ADDR=address)


def test_an_address_past_the_limit_gets_429_and_the_ledger_stays_bounded(db, hook, limits, api):
    automation, _trigger, token = hook()
    client = api.__class__()

    statuses = [_bad(client, automation, "203.0.113.7", n).status_code for n in range(200)]

    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    blocked = _bad(client, automation, "203.0.113.7")
    assert blocked.json() == {"error": {"code": "TOO_MANY_FAILURES",
                                        "message": "too many failed authentications; retry later"}}  # fmt: skip
    assert 1 <= int(blocked["Retry-After"]) <= 55
    # The ledger holds the first few, one by one; the rest are a count.
    assert len(_rejections()) == 5
    assert WebhookRejectionWindow.objects.get(subject=f"ledger:{automation.pk}").count == 201
    # The legitimate sender still fires, from its own address and from the blocked one (behind a
    # proxy or a NAT one address is many senders): a valid token is never refused by a block.
    assert fire(client, automation.pk, token=token, REMOTE_ADDR="198.51.100.1").status_code == 202
    assert fire(client, automation.pk, token=token, REMOTE_ADDR="203.0.113.7").status_code == 202
    assert Run.objects.count() == 2
    assert _bad(client, automation, "203.0.113.7").status_code == 429  # its failures are still refused
    # The window rolls: the address may try again.
    limits["now"] += 60
    assert _bad(client, automation, "203.0.113.7").status_code == 401


def test_an_automation_past_the_limit_answers_failures_429_but_a_valid_token_fires(db, hook, limits, api):
    automation, _trigger, token = hook()
    client = api.__class__()

    statuses = [_bad(client, automation, f"203.0.113.{n % 200}", n).status_code for n in range(120)]

    assert statuses[:50] == [401] * 50
    assert set(statuses[50:]) == {429}
    assert fire(client, automation.pk, token=token, REMOTE_ADDR="203.0.113.9").status_code == 202
    assert len(_rejections()) == 5


def test_each_window_gets_one_summary_row_with_its_count_and_the_ledger_verifies(db, hook, limits, api):
    automation, _trigger, _token = hook()
    client = api.__class__()
    for n in range(30):
        _bad(client, automation, f"198.51.100.{n}", n)

    assert rejections.summarize() == 0, "the window has not ended"
    limits["now"] += 60
    _bad(client, automation, "198.51.100.200")  # the next window's first rejection summarizes the last

    rows = _rejections()
    summaries = [row for row in rows if row.payload.get("aggregate")]
    assert len(summaries) == 1
    assert summaries[0].payload["count"] == 30
    assert summaries[0].payload["unrecorded"] == 25
    assert summaries[0].refs["automation"] == str(automation.pk)
    assert summaries[0].chain == f"ws-{automation.workspace_id}"
    assert len(rows) == 5 + 1 + 1
    limits["now"] += 600
    assert rejections.windows_summarize() == 0, "summarized once"
    sequence_pending()
    assert verify_all().ok


def test_the_beat_task_summarizes_a_window_nobody_rejected_after(db, hook, limits, api):
    automation, _trigger, _token = hook()
    client = api.__class__()
    for n in range(8):
        _bad(client, automation, "198.51.100.3", n)
    for n in range(8):  # ids that are no automation share one count
        fire(
            client,
            f"00000000-0000-0000-0000-00000000000{n}",
            token="apt_x",
            REMOTE_ADDR=f"192.0.2.{n}",
        )
    limits["now"] += 60

    assert rejections.windows_summarize() == 2
    counts = sorted(row.payload["count"] for row in _rejections() if row.payload.get("aggregate"))
    assert counts == [8, 8]
    limits["now"] += 60 * (rejections.KEEP_WINDOWS + 1)
    rejections.windows_summarize()
    assert not WebhookRejectionWindow.objects.exists()


def test_behind_one_proxy_hop_the_client_is_the_right_most_forwarded_address(db, hook, limits, api, settings):
    # given the recommended TLS proxy in front: every request's peer is the proxy
    settings.AUTOPLANE_TRUSTED_PROXY_HOPS = 1
    automation, _trigger, token = hook()
    client = api.__class__()
    proxy = "10.0.0.2"

    # when one client fails past the limit, each time claiming another address in X-Forwarded-For
    statuses = [fire(client, automation.pk, token=f"apt_wrong-{n}", REMOTE_ADDR=proxy,
                     HTTP_X_FORWARDED_FOR=f"192.0.2.{n % 250}, 203.0.113.7").status_code
                for n in range(30)]  # fmt: skip

    # then the spoofed left-most entries are ignored: its own address is blocked
    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    assert _bad_from(client, automation, proxy, "1.2.3.4, 203.0.113.7").status_code == 429
    # and every other sender behind the same proxy is not
    assert _bad_from(client, automation, proxy, "198.51.100.4").status_code == 401
    assert fire(client, automation.pk, token=token, REMOTE_ADDR=proxy,
                HTTP_X_FORWARDED_FOR="198.51.100.4").status_code == 202  # fmt: skip
    # and the blocked client's valid token goes through too
    assert fire(client, automation.pk, token=token, REMOTE_ADDR=proxy,
                HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 202  # fmt: skip
    assert WebhookRejectionWindow.objects.get(subject="addr:203.0.113.7").count == 21
    assert not WebhookRejectionWindow.objects.filter(subject=f"addr:{proxy}").exists()


def test_without_trusted_hops_a_forwarded_header_is_ignored(db, hook, limits, api):
    automation, _trigger, _token = hook()
    client = api.__class__()
    for n in range(25):
        _bad_from(client, automation, "203.0.113.8", f"192.0.2.{n}", n)
    assert _bad_from(client, automation, "203.0.113.8", "192.0.2.200").status_code == 429
    assert not WebhookRejectionWindow.objects.filter(subject__startswith="addr:192.0.2.").exists()


def _bad_from(client, automation, peer: str, forwarded: str, n: int = 0):
    return fire(
        client, automation.pk, token=f"apt_wrong-{n}", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded
    )
