from __future__ import annotations

from django.urls import path

from .. import views as pages
from . import views

urlpatterns = [
    path("approvals", views.ApprovalList.as_view(), name="approval-list"),
    path("approvals/<uuid:pk>", views.ApprovalDetail.as_view(), name="approval-detail"),
    path("approvals/<uuid:pk>/approve", views.ApprovalApprove.as_view(), name="approval-approve"),
    path("approvals/<uuid:pk>/deny", views.ApprovalDeny.as_view(), name="approval-deny"),
    path("approvals/<uuid:pk>/decide", views.ApprovalDecide.as_view(), name="approval-decide"),
    path("approvals/<uuid:pk>/link", views.ApprovalLink.as_view(), name="approval-link-create"),
    # The one-click page itself: HTML, no login (the signed token, in the link's fragment, names the approver).
    path("approvals/link/", pages.approval_link_page, name="approval-link"),
    path("standing-approvals", views.StandingApprovalList.as_view(), name="standing-approval-list"),
    path(
        "standing-approvals/<uuid:pk>/revoke",
        views.StandingApprovalRevoke.as_view(),
        name="standing-approval-revoke",
    ),  # fmt: skip
]
