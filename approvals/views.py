"""The one-click approve page. The link is ``/api/v1/approvals/link/#<token>``: the token is in the
fragment, which browsers never send, so it stays out of access logs, traces and proxies.

GET serves a page whose script reads the fragment, drops it from the address bar and POSTs the
token (``step=review``, CSRF-protected): the answer shows what will run, with an Approve button that
POSTs it again (``step=approve``). Reviewing changes nothing; only the approve POST decides. No login:
the signed token names the approver and works once; ``approval_decide`` checks everything again.
"""

from __future__ import annotations

import json

from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from django.views.decorators.http import require_http_methods

from . import services

MAX_TOKEN_CHARS = 2000


@never_cache
@csrf_protect
@ensure_csrf_cookie
@require_http_methods(["GET", "POST"])
def approval_link_page(request):
    if request.method == "GET":
        return render(request, "approvals/link.html", {"opening": True})
    token = str(request.POST.get("token") or "").strip()[:MAX_TOKEN_CHARS]
    try:
        approval, approver, _ = services.approval_link_read(token)
    except services.ApprovalError as exc:
        return render(request, "approvals/link.html", {"error": exc.message}, status=exc.http_status)
    context = {
        "approval": approval,
        "approver": approver,
        "token": token,
        "what": json.dumps(approval.what, indent=2, sort_keys=True, ensure_ascii=False),
    }
    if request.POST.get("step") == "approve":
        try:
            approval = services.approval_link_confirm(token=token)
        except services.ApprovalError as exc:
            return render(
                request, "approvals/link.html", {**context, "error": exc.message}, status=exc.http_status
            )
        return render(request, "approvals/link.html", {**context, "approval": approval, "done": True})
    return render(request, "approvals/link.html", context)
