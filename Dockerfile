# autoplane: one image for every service of docker-compose.yml (web, workers, beat, migrate).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/app/.venv

# bubblewrap runs code steps in a sandbox (AUTOPLANE_SANDBOX_BACKEND=bubblewrap); prlimit (util-linux,
# in the base image) sets its limits. The worker services need docker-compose.yml's security_opt.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir uv

WORKDIR /app
# Dependencies first, so code changes do not reinstall them.
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project
COPY . .
RUN uv sync --frozen --no-dev

RUN useradd --create-home --uid 10001 autoplane && mkdir -p /app/var && chown autoplane /app/var
USER autoplane
ENV PATH=/app/.venv/bin:$PATH \
    AUTOPLANE_DATA_DIR=/app/var

EXPOSE 8000
CMD ["gunicorn", "ops.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
