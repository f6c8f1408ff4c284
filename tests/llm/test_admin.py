"""The admin's "New from a sentence" page: prompt → review (summary, flags, definition
or diff) → Save or Discard, through the same services as the API."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from automations import services
from automations.models import Automation, Draft
from tests.llm_server import reply_json

from .test_drafts import DIGEST, PROMPT, REVIEW, with_step

pytestmark = pytest.mark.django_db


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label="automations", codename__in=["view_draft", "add_draft", "view_automation"]))  # fmt: skip
    client = Client()
    client.force_login(user)
    return client


def test_a_sentence_becomes_a_reviewed_draft_and_save_creates_the_automation(llm, operator, workspace):
    admin = staff(operator)
    page = admin.get(reverse("admin:automations_draft_add"))
    assert page.status_code == 200
    assert 'id="draft-form"' in page.content.decode()
    llm.script(reply_json(DIGEST), reply_json({**REVIEW, "summary": "Posts <b>failed</b> runs."}))

    posted = admin.post(reverse("admin:automations_draft_add"), {"workspace": workspace.pk, "prompt": PROMPT})

    draft = Draft.objects.get()
    assert posted.status_code == 302
    assert posted["Location"] == reverse("admin:automations_draft_change", args=[draft.pk])
    review = admin.get(posted["Location"]).content.decode()
    assert "Posts &lt;b&gt;failed&lt;/b&gt; runs." in review  # model text is escaped, never markup
    assert "external_write" in review
    assert "&quot;https://hooks.example.com/failed&quot;" in review
    assert Automation.objects.count() == 0

    saved = admin.post(posted["Location"], {"_save_draft": "Save"})

    automation = Automation.objects.get()
    assert saved["Location"] == reverse("admin:automations_automation_change", args=[automation.pk])
    assert automation.definition == DIGEST


def test_a_viewer_sees_the_draft_but_cannot_save_it(llm, operator, viewer, workspace):
    llm.script(reply_json(DIGEST), reply_json(REVIEW))
    staff(operator).post(
        reverse("admin:automations_draft_add"), {"workspace": workspace.pk, "prompt": PROMPT}
    )
    draft = Draft.objects.get()

    answer = staff(viewer).post(
        reverse("admin:automations_draft_change", args=[draft.pk]), {"_save_draft": "Save"}
    )

    assert answer.status_code == 200
    assert "PERMISSION_DENIED" in answer.content.decode()
    assert Automation.objects.count() == 0


def test_editing_shows_the_diff_and_discard_leaves_the_automation_alone(llm, operator, workspace):
    automation = services.automation_create(workspace=workspace, definition=DIGEST, user=operator)
    llm.script(reply_json(with_step(DIGEST, url="https://hooks.example.com/ops")), reply_json(REVIEW))
    admin = staff(operator)
    posted = admin.post(reverse("admin:automations_draft_add"),
                        {"workspace": workspace.pk, "automation": automation.pk, "prompt": "post to ops"})  # fmt: skip

    review = admin.get(posted["Location"]).content.decode()
    assert 'id="draft-diff"' in review
    assert "hooks.example.com/ops" in review

    admin.post(posted["Location"], {"_discard_draft": "Discard"})

    assert Draft.objects.get().status == "discarded"
    automation.refresh_from_db()
    assert automation.version == 1


def test_without_an_llm_the_page_says_so(no_llm, operator):
    page = staff(operator).get(reverse("admin:automations_draft_add")).content.decode()

    assert "LLM_NOT_CONFIGURED" in page
    assert 'id="draft-form"' not in page
