from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView

from config.schema_view import CachedSchemaView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", CachedSchemaView.as_view(), name="openapi-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="api-docs"),
    path("api/v1/", include("config.api_urls")),
    path("", include("config.ops_urls")),
]
