"""``/api/schema/`` served from one schema per process (its own module: config.openapi is
DRF's schema class, imported while DRF's views are, so it cannot import a view itself)."""

from __future__ import annotations

import threading
from typing import ClassVar

from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.response import Response


class CachedSchemaView(SpectacularAPIView):
    """``/api/schema/``, generated once per process (it is public: generating it walks every view's
    serializers, ~0.3 s of CPU that any stranger could ask for again and again).

    The API has one version and one language, so ``?version=`` and ``?lang=`` pick nothing here
    (drf-spectacular would generate, and key, a schema per value a caller makes up).
    """

    _schema: ClassVar[dict | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        return Response(data=self.cached_schema(),
                        headers={"Content-Disposition": f'inline; filename="{self._get_filename(request, None)}"'})  # fmt: skip

    @classmethod
    def cached_schema(cls) -> dict:
        if cls._schema is None:
            with cls._lock:
                if cls._schema is None:
                    generator = cls.generator_class(urlconf=cls.urlconf, patterns=cls.patterns)
                    cls._schema = generator.get_schema(request=None, public=True)
        return cls._schema
