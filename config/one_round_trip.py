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
On PostgreSQL each statement is prepared once per database session and sent as
``EXECUTE`` (see below): PostgreSQL parses and plans it once, not on every query.
The statements are the ORM's own (compiled, not hand-written), so columns,
defaults (``auto_now_add``) and value adaptation are the same as ``save()``'s;
unlike ``save()``, no ``pre_save``/``post_save`` signal is sent (the models written
this way have no receivers).
"""

from __future__ import annotations

import datetime
import hashlib
import re
import uuid
import weakref
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DatabaseError, DataError, OperationalError, connections
from django.db.models import Field, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery, UpdateQuery

from config import seams

Statement = tuple[str, list[Any]]

try:
    from psycopg import _queries as _psycopg_queries
    from psycopg.pq import TransactionStatus
    from psycopg.types.json import Json, Jsonb

    _IDLE: Any = TransactionStatus.IDLE
    # psycopg parses a client-bound query (splits it at its placeholders) once and caches the
    # parse, but only for queries of at most 50 parameters; a run's final writes have ~100
    # (its UPDATE, step rows, event and five audit entries) and were parsed afresh each run
    # (~0.3 ms of the worker's CPU). The same few shapes recur, so let them be cached too
    # (psycopg's LRU cache still holds at most 128 queries, each at most 4 kB of text).
    if getattr(_psycopg_queries, "MAX_CACHED_STATEMENT_PARAMS", 1000) < 200 and seams.fast_path("psycopg"):
        _psycopg_queries.MAX_CACHED_STATEMENT_PARAMS = 200
except ImportError:  # no psycopg (SQLite only): never compared
    _IDLE = None
    Json = Jsonb = None  # type: ignore[assignment,misc]


# --- statements prepared once per database session ------------------------------------------
# Django binds parameters on the client, so PostgreSQL parses and plans every statement of a
# query afresh. A hot-path statement is instead PREPAREd once per database session and sent as
# ``EXECUTE name(<the same literals>)`` in the same simple-protocol query: the same round trips,
# transaction and quoting; PostgreSQL only keeps the parse and the plan (the server's time for a
# run's final query: ~0.3 ms less). A new statement's PREPARE goes in the query that first
# executes it. ``AUTOPLANE_PREPARED_STATEMENTS=off`` sends every statement as its text instead
# (for a transaction pooler). See docs/operations.md on poolers.

PREPARED_PREFIX = "autoplane_q_"
_MAX_PREPARED = 32  # statements per database session; any further one goes as text
_MAX_PREPARED_PARAMS = 500  # a bigger statement (e.g. the audit rows of a long run) goes as text
_MAX_SHAPES = 1000  # statements (text, parameter types) this process keeps a shape for
_NO_SUCH_STATEMENT = "26000"  # the session lost the statement (DISCARD ALL, DEALLOCATE, a pooler)
_STATEMENT_EXISTS = "42P05"  # the session has it already (a pooler handed over another session)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s")
# The type a PREPARE declares a parameter with, by the value's Python type: only the types whose
# literal psycopg writes with a cast that does not depend on the value. Any other parameter
# (str, int, None, a list) is declared ``unknown``: PostgreSQL infers its type from where it is
# used, as it does for a literal without a cast.
_DECLARED: dict[type, str] = {uuid.UUID: "uuid", datetime.date: "date", Decimal: "numeric", bool: "boolean",
                              float: "double precision", bytes: "bytea"}  # fmt: skip
if Jsonb is not None:
    _DECLARED.update({Jsonb: "jsonb", Json: "json"})


class StatementsOutOfStep(OperationalError):
    """The database session's prepared statements were not what this process counted on (a pooler
    handed over another session; ``DISCARD ALL``; a table changed under a ``RETURNING``): the
    query failed and its transaction rolled back. Transient: the caller starts over
    (:mod:`automations.transient` does, on a new connection)."""


class _Shape:
    __slots__ = ("execute", "name", "prepare")

    def __init__(self, sql: str, names: tuple[str, ...] | None, values: list[Any]) -> None:
        count = 0

        def number(match: re.Match) -> str:
            nonlocal count
            if match.group(1) is not None:
                assert names is not None
                return f"${names.index(match.group(1)) + 1}"
            count += 1
            return f"${count}"

        text = _PLACEHOLDER.sub(number, sql)
        types = ", ".join(_declared(value) for value in values)
        body = f"({types}) AS {text}" if values else f" AS {text}"
        self.name = PREPARED_PREFIX + hashlib.sha1(body.encode()).hexdigest()[:24]  # noqa: S324 - a name
        self.prepare = f"PREPARE {self.name}{body}"
        if names is not None:
            arguments = ", ".join(f"%({name})s" for name in names)
        else:
            arguments = ", ".join(["%s"] * len(values))
        self.execute = f"EXECUTE {self.name}({arguments})" if values else f"EXECUTE {self.name}"


def _declared(value: Any) -> str:
    if isinstance(value, datetime.datetime):
        return "timestamptz" if value.tzinfo is not None else "timestamp"
    for cls in type(value).__mro__:
        declared = _DECLARED.get(cls)
        if declared is not None:
            return declared
    return "unknown"


_shapes: dict[tuple[str, tuple[type, ...]], _Shape | None] = {}  # None: always sent as text
_named: dict[str, tuple[str, ...]] = {}  # a statement's named parameters, in order of first use
_refused: set[str] = set()  # statements PostgreSQL would not prepare: sent as text
# Per psycopg connection (database session), the statements prepared in it; None: not known (a
# query that prepared some failed, or the session's were out of step): asked of the server.
_sessions: weakref.WeakKeyDictionary[Any, set[str] | None] = weakref.WeakKeyDictionary()


def _shape(sql: str, params: Any) -> _Shape | None:
    if isinstance(params, dict):
        names = _named.get(sql)
        if names is None:
            names = _named[sql] = tuple(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(sql)))
        values = [params[name] for name in names]
    else:
        names, values = None, params
    key = (sql, tuple(map(type, values)))
    try:
        return _shapes[key]
    except KeyError:
        pass
    if len(_shapes) >= _MAX_SHAPES:
        return None
    shape = _Shape(sql, names, values) if len(values) <= _MAX_PREPARED_PARAMS else None
    _shapes[key] = shape
    return shape


def _prepared(connection: Any, statements: list[Statement]) -> tuple[list[str], list[Statement], list[str]]:
    """The PREPAREs to send first, the statements as sent (``EXECUTE`` where prepared), the names
    the PREPAREs add to the session. With ``AUTOPLANE_PREPARED_STATEMENTS`` off (a transaction
    pooler): none, the statements as given."""
    if not settings.AUTOPLANE_PREPARED_STATEMENTS:
        return [], statements, []
    connection.ensure_connection()
    raw = connection.connection
    known = _sessions.get(raw, ())
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM pg_prepared_statements")
            known = {name for (name,) in cursor.fetchall()}
    if not isinstance(known, set):
        known = set()
    _sessions[raw] = known
    prepares: list[str] = []
    new: list[str] = []
    sent: list[Statement] = []
    for sql, params in statements:
        shape = _shape(sql, params)
        if shape is None or shape.name in _refused:
            sent.append((sql, params))
            continue
        if shape.name not in known and shape.name not in new:
            if len(known) + len(new) >= _MAX_PREPARED:
                sent.append((sql, params))
                continue
            prepares.append(shape.prepare)
            new.append(shape.name)
        sent.append((shape.execute, params))
    return prepares, sent, new


def _out_of_step(connection: Any, exc: DatabaseError, new: list[str]) -> bool:
    """After a query that failed: whether it failed because the session's prepared statements
    were not what this process counted on (or a statement could not be prepared), so that the
    same writes sent again can succeed."""
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    stale_plan = state == "0A000" and "cached plan must not change result type" in str(exc)
    out_of_step = state in (_NO_SUCH_STATEMENT, _STATEMENT_EXISTS) or stale_plan
    if new or out_of_step:
        # What the session holds now is not known (a PREPARE outlives its failed transaction).
        _sessions[connection.connection] = None
    if stale_plan and not connection.in_atomic_block:
        connection.close()  # its plans are stale: a new session prepares afresh
    if new and state.startswith("42") and state != _STATEMENT_EXISTS:
        _refused.update(new)  # a statement PostgreSQL cannot prepare as declared: as text from now on
        return True
    return out_of_step


def _sent(connection: Any, new: list[str]) -> None:
    if not new:
        return
    known = _sessions.get(connection.connection)
    if known is not None:
        known.update(new)


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
    connection = connections[using]
    for attempt in (1, 2):
        prepares, sent, new = _prepared(connection, statements)
        sql = ";\n".join(prepares + [statement for statement, _ in sent])
        params = [param for _, statement_params in sent for param in statement_params]
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
        except DatabaseError as exc:
            # One implicit transaction: nothing was written; sent again, prepared afresh.
            if attempt == 2 or not _out_of_step(connection, exc, new):
                raise
        else:
            _sent(connection, new)
            return


def select(sql: str, params: list[Any], using: str = "default") -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (one statement), on PostgreSQL prepared once per database session like
    the writes (the webhook's trigger lookup). Outside a transaction, a session that lost the
    statement or already has it (``DISCARD ALL``, a pooler handing over another session) is asked
    what it holds and the statement sent again; inside one, :class:`StatementsOutOfStep` is raised."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    for attempt in (1, 2):
        prepares, [(text, sent_params)], new = _prepared(connection, [(sql, params)])
        try:
            with connection.cursor() as cursor:
                cursor.execute(";\n".join([*prepares, text]), sent_params)
                for _ in prepares:
                    cursor.nextset()
                rows = cursor.fetchall()
        except DatabaseError as exc:
            if not _out_of_step(connection, exc, new):
                raise
            if attempt == 2 or connection.in_atomic_block:
                raise StatementsOutOfStep(str(exc)) from exc
            continue
        _sent(connection, new)
        return rows
    raise AssertionError("unreachable")


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


def _column_names(cursor: Any) -> list[str]:
    # On psycopg, read from the result itself: cursor.description makes a Column object per
    # column (the claim's ~40: ~28 us, 2 us this way). Django's psycopg connections are UTF8.
    result = getattr(cursor, "pgresult", None)
    if result is None or not seams.fast_path("psycopg"):
        return [column[0] for column in cursor.description]
    name = result.fname
    return [name(i).decode() for i in range(result.nfields)]


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
    SQLite, pipeline mode, ``AUTOPLANE_FAST_PATHS=off``, a psycopg outside :mod:`config.seams`' bounds)
    it is a plain ``execute``.
    """
    connection = connections[using]
    prepares: list[str] = []
    new: list[str] = []
    if connection.vendor == "postgresql":
        prepares, [(sql, params)], new = _prepared(connection, [(sql, params)])
    try:
        with connection.cursor() as cursor:
            raw = connection.connection
            if (
                connection.vendor == "postgresql"
                and connection.in_atomic_block
                and not getattr(raw, "autocommit", True)
                and getattr(raw, "_pipeline", True) is None
                and hasattr(raw, "_autocommit")
                and raw.pgconn.transaction_status == _IDLE
                and seams.fast_path("psycopg")
            ):
                begin = raw._get_tx_start_command().decode()
                raw._autocommit = True  # for this query only: its BEGIN is in the query, not sent before it
                try:
                    cursor.execute(";\n".join([begin, *prepares, sql]), params)
                finally:
                    raw._autocommit = False
                cursor.nextset()  # past the BEGIN's (empty) result
            else:
                cursor.execute(";\n".join([*prepares, sql]), params)
            for _ in prepares:
                cursor.nextset()
            result = _column_names(cursor), cursor.fetchall()
    except DatabaseError as exc:
        if connection.vendor == "postgresql" and _out_of_step(connection, exc, new):
            raise StatementsOutOfStep(str(exc)) from exc
        raise
    _sent(connection, new)
    return result


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
    prepares, sent, new = _prepared(connection, statements)
    sql = ";\n".join(prepares + [statement for statement, _ in sent] + (["COMMIT"] if commit else []))
    params = [param for _, statement_params in sent for param in statement_params]
    results: list[Result] = []
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            for _ in prepares:
                cursor.nextset()
            while True:
                results.append((cursor.rowcount, cursor.fetchall() if cursor.description else None))
                if not cursor.nextset():
                    break
    except DatabaseError as exc:
        if _out_of_step(connection, exc, new):
            raise StatementsOutOfStep(str(exc)) from exc
        if isinstance(exc, DataError) and _FENCE_MISSED in str(exc):
            raise FenceMissed(str(exc)) from exc
        raise
    _sent(connection, new)
    if commit:
        results.pop()
    if len(results) != len(statements):
        raise RuntimeError(f"{len(statements)} statements sent, {len(results)} results")
    return results
