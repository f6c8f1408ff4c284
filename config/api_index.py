"""``GET /api/v1/``: what the API has, as links, and where its documentation is.

The resources are read from the URL configuration itself (every route under
``/api/v1/`` without a path parameter), so a new app's routes appear here
without anyone editing a list.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, get_resolver, reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

API_PREFIX = "api/v1/"


class ApiIndexOut(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.CharField()
    docs = serializers.URLField(help_text="interactive documentation (Swagger UI)")
    schema = serializers.URLField(help_text="the OpenAPI 3 description of this API")
    resources = serializers.DictField(
        child=serializers.URLField(), help_text="every route without a path parameter, by its path"
    )


def _routes(patterns, prefix: str = "") -> list[str]:
    routes: list[str] = []
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if "<" in route:
            continue
        if isinstance(entry, URLResolver):
            routes += _routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and route:
            routes.append(route)
    return routes


def api_routes() -> list[str]:
    """The parameterless routes under /api/v1/, sorted, relative to it."""
    for entry in get_resolver().url_patterns:
        if isinstance(entry, URLResolver) and str(entry.pattern) == API_PREFIX:
            return sorted(set(_routes(entry.url_patterns)))
    return []


class ApiIndex(APIView):
    authentication_classes: list = []  # links only: nobody needs to sign in to read them
    permission_classes = [AllowAny]

    @extend_schema(responses=ApiIndexOut, summary="The API's resources and its documentation")
    def get(self, request):
        base = request.build_absolute_uri(f"/{API_PREFIX}")
        return Response(
            {
                "name": "autoplane API",
                "version": "1",
                "docs": request.build_absolute_uri(reverse("api-docs")),
                "schema": request.build_absolute_uri(reverse("openapi-schema")),
                "resources": {route: base + route for route in api_routes()},
            }
        )
