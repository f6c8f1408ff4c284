"""Several writes in one round trip to PostgreSQL, as one transaction.

PostgreSQL runs a simple-protocol query holding several statements as one
implicit transaction: all of them commit, or none does. Django's psycopg backend
binds parameters on the client (``ClientCursor``), so statements compiled by the
ORM can be joined and sent in one ``execute``: no ``BEGIN``, no ``COMMIT``, one
network round trip and one commit for what would otherwise be five round trips.

:func:`execute` only outside a transaction (autocommit), on PostgreSQL:
:func:`available` says when. :func:`send` is the same inside a transaction (the
worker's final writes, under the claim's row lock): the statements run in it,
and one that fails breaks it, so all of them roll back with it; each
statement's row count and rows come back, for the caller to check its fences.
The statements are the ORM's own (compiled, not hand-written), so columns,
defaults (``auto_now_add``) and value adaptation are the same as ``save()``'s;
unlike ``save()``, no ``pre_save``/``post_save`` signal is sent (the models written
this way have no receivers).
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, DataError, connections
from django.db.models import Field, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery, UpdateQuery

Statement = tuple[str, list[Any]]

try:
    from psycopg import _queries as _psycopg_queries
    from psycopg.pq import TransactionStatus

    _IDLE: Any = TransactionStatus.IDLE
    # psycopg parses a client-bound query (splits it at its placeholders) once and caches the
    # parse, but only for queries of at most 50 parameters; a run's final writes have ~100
    # (its UPDATE, step rows, event and five audit entries) and were parsed afresh each run
    # (~0.3 ms of the worker's CPU). The same few shapes recur, so let them be cached too
    # (psycopg's LRU cache still holds at most 128 queries, each at most 4 kB of text).
    if getattr(_psycopg_queries, "MAX_CACHED_STATEMENT_PARAMS", 1000) < 200:
        _psycopg_queries.MAX_CACHED_STATEMENT_PARAMS = 200
except ImportError:  # no psycopg (SQLite only): never compared
    _IDLE = None


def available(using: str = "default") -> bool:
    connection = connections[using]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


# The INSERT's text per (model, database alias, the SQL of each value given as RawSQL or None):
# it never changes, only its values do.
_insert_sql: dict[tuple[type[Model], str, tuple[str | None, ...]], str] = {}


def insert(obj: Model, using: str = "default") -> Statement:
    """The INSERT ``obj.save(force_insert=True)`` would send (the primary key set in Python, no RETURNING).

    The statement's text is compiled once per model (compiling it was most of the
    Python work of a fire's write) and per set of values given as SQL (``RawSQL``, e.g.
    the event's ``delivered_at``: its text in the statement, its parameters among the
    values); each call computes the values as the compiler does: ``pre_save``
    (``auto_now_add``), then ``get_db_prep_save``. A value that is another expression,
    or a field with its own placeholder, gets the full compilation. The text is cached
    only when it is what the compiler wrote.
    """
    meta = obj._meta
    if obj.pk is None or meta.auto_field is not None:
        raise ValueError(f"{meta.label}: only rows whose primary key is set before the insert")
    model = type(obj)
    fields = [f for f in meta.local_concrete_fields if not f.generated]
    values = [field.pre_save(obj, True) for field in fields]
    raw = tuple(value.sql if type(value) is RawSQL else None for value in values)
    other_expressions = any(
        type(value) is not RawSQL and hasattr(value, "resolve_expression") for value in values
    )
    key = (model, using, raw)
    sql = _insert_sql.get(key)
    if sql is not None and not other_expressions:
        connection = connections[using]
        prepared: list[Any] = []
        for field, value in zip(fields, values, strict=True):
            if type(value) is RawSQL:
                prepared.extend(value.params)
            else:
                prepared.append(field.get_db_prep_save(value, connection=connection))
        return sql, prepared
    query = InsertQuery(model)
    query.insert_values(fields, [obj])
    [(sql, params)] = query.get_compiler(using=using).as_sql()
    plain = all(getattr(field, "get_placeholder", None) is None for field in fields)
    placeholders = ", ".join("%s" if text is None else f"({text})" for text in raw)
    count = sum(1 if text is None else len(value.params) for text, value in zip(raw, values, strict=True))
    if plain and not other_expressions and len(params) == count and sql.endswith(f"VALUES ({placeholders})"):
        _insert_sql[key] = sql
    return sql, list(params)


def mark_saved(obj: Model, using: str = "default") -> None:
    """``obj`` as ``save()`` leaves it, once :func:`execute` sent its :func:`insert`."""
    obj._state.adding = False
    obj._state.db = using


def update(queryset: QuerySet, values: dict[str, Any], using: str = "default") -> Statement:
    """The UPDATE ``queryset.update(**values)`` would send."""
    query = queryset.query.chain(UpdateQuery)
    assert isinstance(query, UpdateQuery)
    query.add_update_values(values)
    sql, params = query.get_compiler(using=using).as_sql()
    return sql, list(params)


# The text of ``UPDATE <table> SET <columns> WHERE <pk> = %s`` per (model, columns, alias).
_update_row_sql: dict[tuple[type[Model], tuple[str, ...], str], str] = {}


def update_row(model: type[Model], pk: Any, values: dict[str, Any], using: str = "default") -> Statement:
    """The UPDATE ``model.objects.filter(pk=pk).update(**values)`` would send, its text compiled
    once per model and columns; the values prepared as the compiler does (``get_db_prep_save``,
    the key by its field). An expression among the values gets the full compilation."""
    if any(hasattr(value, "resolve_expression") for value in values.values()):
        return update(model._default_manager.filter(pk=pk), values, using)
    key = (model, tuple(values), using)
    sql = _update_row_sql.get(key)
    if sql is None:
        sql, params = update(model._default_manager.filter(pk=pk), values, using)
        fields = [model._meta.get_field(name) for name in values]
        if (
            all(getattr(field, "get_placeholder", None) is None for field in fields)
            and len(params) == len(values) + 1
        ):
            _update_row_sql[key] = sql
        return sql, params
    connection = connections[using]
    meta = model._meta
    prepared = []
    for name, value in values.items():
        field = meta.get_field(name)
        assert isinstance(field, Field)  # a column: update() takes nothing else
        prepared.append(field.get_db_prep_save(value, connection=connection))
    return sql, [*prepared, meta.pk.get_db_prep_value(pk, connection)]


def execute(statements: list[Statement], using: str = "default") -> None:
    """Send ``statements`` in one query: one round trip, one transaction (all or nothing)."""
    if not available(using):
        raise RuntimeError("one_round_trip.execute needs PostgreSQL in autocommit (outside atomic blocks)")
    sql = ";\n".join(statement for statement, _ in statements)
    params = [param for _, statement_params in statements for param in statement_params]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)


# The multi-row INSERT's text per (model, database alias, number of rows).
_insert_many_sql: dict[tuple[type[Model], str, int], str] = {}


def insert_many(objs: list[Model], using: str = "default") -> Statement:
    """The multi-row INSERT ``bulk_create(objs)`` would send on PostgreSQL, with ``RETURNING`` the
    primary keys (in the rows' order, as ``bulk_create`` relies on) when the model's key is automatic.

    Its text is compiled once per model and number of rows, and cached only when it is the
    plain ``VALUES (%s, …)`` the compiler wrote (one row: a one-step run's; for several rows
    Django writes an ``UNNEST`` of one array per column, compiled each time); each call computes the values as the
    compiler does (``pre_save``, then ``get_db_prep_save``). A value that is an expression,
    or a field with its own placeholder, gets the full compilation."""
    meta = objs[0]._meta
    model = type(objs[0])
    fields = [f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field]
    key = (model, using, len(objs))
    sql = _insert_many_sql.get(key)
    if sql is not None:
        rows = [[field.pre_save(obj, True) for field in fields] for obj in objs]
        if not any(hasattr(value, "resolve_expression") for row in rows for value in row):
            connection = connections[using]
            return sql, [
                field.get_db_prep_save(value, connection=connection)
                for row in rows
                for field, value in zip(fields, row, strict=True)
            ]
    query = InsertQuery(model)
    query.insert_values(fields, objs)
    compiler = query.get_compiler(using=using)
    if meta.auto_field is not None:
        compiler.returning_fields = [meta.pk]
    [(sql, params)] = compiler.as_sql()
    plain = all(getattr(field, "get_placeholder", None) is None for field in fields)
    row = f"({', '.join(['%s'] * len(fields))})"
    if plain and len(params) == len(fields) * len(objs) and f" VALUES {', '.join([row] * len(objs))}" in sql:
        _insert_many_sql[key] = sql
    return sql, list(params)


def first_in_transaction(
    sql: str, params: Any, using: str = "default"
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` (one statement returning rows) and return its column names and rows; when it is
    the first statement of a transaction, the transaction's ``BEGIN`` goes in the same query.

    psycopg opens a transaction lazily, sending its ``BEGIN`` as a round trip of its own
    before the transaction's first statement. Here the ``BEGIN`` psycopg would send (the same
    text: isolation level and all) is put in front of ``sql`` instead, in one simple-protocol
    query: one round trip fewer, the same transaction. psycopg then sees the transaction open
    (and sends no ``BEGIN`` of its own for what follows); its ``COMMIT`` and ``ROLLBACK`` and
    Django's atomic block work as usual. Anywhere else (a transaction already open, autocommit,
    SQLite, pipeline mode) it is a plain ``execute``.
    """
    connection = connections[using]
    with connection.cursor() as cursor:
        raw = connection.connection
        if (
            connection.vendor == "postgresql"
            and connection.in_atomic_block
            and not getattr(raw, "autocommit", True)
            and getattr(raw, "_pipeline", True) is None
            and hasattr(raw, "_autocommit")
            and raw.pgconn.transaction_status == _IDLE
        ):
            begin = raw._get_tx_start_command().decode()
            raw._autocommit = True  # for this query only: its BEGIN is in the query, not sent before it
            try:
                cursor.execute(f"{begin};\n{sql}", params)
            finally:
                raw._autocommit = False
            cursor.nextset()  # past the BEGIN's (empty) result
        else:
            cursor.execute(sql, params)
        return [column[0] for column in cursor.description], cursor.fetchall()


Result = tuple[int, list[tuple[Any, ...]] | None]
_FENCE_MISSED = "one_round_trip: the fence missed"


class FenceMissed(DatabaseError):
    """An UPDATE made :func:`one_row` changed no row (or several): the query stopped there."""


def one_row(update: Statement) -> Statement:
    """``update`` (an UPDATE statement) made to stop the query unless it changes exactly one row.

    For a fence checked *before* what follows it in the query runs, e.g. before a
    ``COMMIT`` sent with it (:func:`send`, ``commit=True``): the statement fails, so
    the query stops and its transaction rolls back; :func:`send` raises
    :class:`FenceMissed`. (The cast fails only on the branch taken, which depends on
    the row count, so it is never folded into a constant when planned.)
    """
    sql, params = update
    return (
        f"WITH changed AS ({sql} RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1"  # noqa: S608
        f" ELSE ('{_FENCE_MISSED}: ' || count(*) || ' rows')::int END FROM changed",
        params,
    )


def send(statements: list[Statement], using: str = "default", *, commit: bool = False) -> list[Result]:
    """Send ``statements`` in one query inside the current transaction: one round trip.

    Returns each statement's row count and rows (None for a statement returning none),
    in order. A statement that fails fails the query, and the statements after it are
    not run: the caller's transaction is then broken and rolls back, so the statements
    before it are undone too. PostgreSQL only.

    ``commit``: the query ends with ``COMMIT``, saving the commit's own round trip; only
    for a caller whose transaction has nothing left to write, and whose checks were made
    in SQL (:func:`one_row`), as a row count read afterwards comes too late to stop the
    commit. Django's atomic block then commits nothing more (psycopg sends no ``COMMIT``
    when no transaction is open) and runs its ``on_commit`` callbacks as usual.
    """
    connection = connections[using]
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        raise RuntimeError("one_round_trip.send needs PostgreSQL inside an atomic block")
    sql = ";\n".join([statement for statement, _ in statements] + (["COMMIT"] if commit else []))
    params = [param for _, statement_params in statements for param in statement_params]
    results: list[Result] = []
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            while True:
                results.append((cursor.rowcount, cursor.fetchall() if cursor.description else None))
                if not cursor.nextset():
                    break
    except DataError as exc:
        if _FENCE_MISSED in str(exc):
            raise FenceMissed(str(exc)) from exc
        raise
    if commit:
        results.pop()
    if len(results) != len(statements):
        raise RuntimeError(f"{len(statements)} statements sent, {len(results)} results")
    return results
