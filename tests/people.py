"""The people of a test: members of a workspace with one role each, and their API clients."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from workspaces.services import membership_set_role


def member(username: str, workspace, role: str, **extra):
    user = get_user_model().objects.create_user(username=username, password="pw-" + username, **extra)
    membership_set_role(workspace=workspace, user=user, role=role)
    return user


def client_for(user) -> APIClient:
    """An API client authenticated with the user's token."""
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
