# Day-to-day commands; CI runs .ci/run.
.PHONY: dev test test-pg lint fmt bench

PG_LANE = DATABASE_URL=postgres://postgres@127.0.0.1:5432/autoplane CELERY_BROKER_URL=redis://127.0.0.1:6379/15

dev:  ## the whole platform on this machine (Ctrl-C stops it)
	./autoplane up

test:  ## the suite on the embedded lane (SQLite + SQLAlchemy broker)
	./autoplane test

test-pg:  ## the suite on PostgreSQL + Redis
	$(PG_LANE) ./autoplane test

lint:
	uv run ruff check .
	uv run ruff format --check .
	uv run manage.py makemigrations --check --dry-run

fmt:
	uv run ruff format .
	uv run ruff check --fix .

bench:  ## engine vs bare Celery on the configured database and broker (see docs/performance.md)
	uv run manage.py bench
