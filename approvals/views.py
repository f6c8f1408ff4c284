"""The one-click approve page: GET shows what will run, POST (CSRF-protected) approves.

No login: the signed link names the approver and works once. Everything a
decision needs is checked again by ``approval_decide``.
"""

from __future__ import annotations

import json

from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_http_methods

from . import services


@never_cache
@csrf_protect
@require_http_methods(["GET", "POST"])
def approval_link_page(request, token: str):
    try:
        approval, approver, _ = services.approval_link_read(token)
    except services.ApprovalError as exc:
        return render(request, "approvals/link.html", {"error": exc.message}, status=exc.http_status)
    context = {
        "approval": approval,
        "approver": approver,
        "what": json.dumps(approval.what, indent=2, sort_keys=True, ensure_ascii=False),
    }
    if request.method == "POST":
        try:
            approval = services.approval_link_confirm(token=token)
        except services.ApprovalError as exc:
            return render(
                request, "approvals/link.html", {**context, "error": exc.message}, status=exc.http_status
            )
        return render(request, "approvals/link.html", {**context, "approval": approval, "done": True})
    return render(request, "approvals/link.html", context)
