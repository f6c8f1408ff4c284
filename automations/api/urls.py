from __future__ import annotations

from django.urls import path

from . import drafts, views

urlpatterns = [
    path("automations", views.AutomationList.as_view(), name="automation-list"),
    path("automations/apply", views.AutomationApply.as_view(), name="automation-apply"),
    path("automations/<uuid:pk>/export", views.AutomationExport.as_view(), name="automation-export"),
    path("automations/<uuid:pk>/activate", views.AutomationActivate.as_view(), name="automation-activate"),
    path("automations/<uuid:pk>", views.AutomationDetail.as_view(), name="automation-detail"),
    path("automations/<uuid:pk>/versions", views.AutomationVersions.as_view(), name="automation-versions"),
    path("automations/<uuid:pk>/run", views.AutomationRun.as_view(), name="automation-run"),
    path("runs", views.RunList.as_view(), name="run-list"),
    path("runs/<uuid:pk>", views.RunDetail.as_view(), name="run-detail"),
    path("runs/<uuid:pk>/test-case", views.RunTestCase.as_view(), name="run-test-case"),
    path("runs/<uuid:pk>/cancel", views.RunCancel.as_view(), name="run-cancel"),
    path("runs/<uuid:pk>/rerun", views.RunRerun.as_view(), name="run-rerun"),
    path("runs/<uuid:pk>/resolve", views.RunResolve.as_view(), name="run-resolve"),
    path("events", views.EventPublish.as_view(), name="event-publish"),
    path("drafts", drafts.DraftCreate.as_view(), name="draft-create"),
    path("drafts/<uuid:pk>", drafts.DraftDetail.as_view(), name="draft-detail"),
    path("drafts/<uuid:pk>/save", drafts.DraftSave.as_view(), name="draft-save"),
    path("drafts/<uuid:pk>/discard", drafts.DraftDiscard.as_view(), name="draft-discard"),
    path("schema/definition", views.DefinitionSchema.as_view(), name="schema-definition"),
    path("schema/filter", views.FilterSchema.as_view(), name="schema-filter"),
]
