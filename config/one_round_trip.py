"""Several writes in one round trip to PostgreSQL, as one transaction.

PostgreSQL runs a simple-protocol query holding several statements as one
implicit transaction: all of them commit, or none does. Django's psycopg backend
binds parameters on the client (``ClientCursor``), so statements compiled by the
ORM can be joined and sent in one ``execute``: no ``BEGIN``, no ``COMMIT``, one
network round trip and one commit for what would otherwise be five round trips.

Only outside a transaction (autocommit), on PostgreSQL: :func:`available` says when.
The statements are the ORM's own (compiled, not hand-written), so columns,
defaults (``auto_now_add``) and value adaptation are the same as ``save()``'s;
unlike ``save()``, no ``pre_save``/``post_save`` signal is sent (the models written
this way have no receivers).
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.sql import InsertQuery, UpdateQuery

Statement = tuple[str, list[Any]]


def available(using: str = "default") -> bool:
    connection = connections[using]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


# The INSERT's text per (model, database alias): it never changes, only its values do.
_insert_sql: dict[tuple[type[Model], str], str] = {}


def insert(obj: Model, using: str = "default") -> Statement:
    """The INSERT ``obj.save(force_insert=True)`` would send (the primary key set in Python, no RETURNING).

    The statement's text is compiled once per model (compiling it was most of the
    Python work of a fire's write); each call computes the values as the compiler
    does: ``pre_save`` (``auto_now_add``), then ``get_db_prep_save``. A value that is
    an expression, or a field with its own placeholder, gets the full compilation.
    """
    meta = obj._meta
    if obj.pk is None or meta.auto_field is not None:
        raise ValueError(f"{meta.label}: only rows whose primary key is set before the insert")
    model = type(obj)
    fields = [f for f in meta.local_concrete_fields if not f.generated]
    sql = _insert_sql.get((model, using))
    if sql is not None:
        values = [field.pre_save(obj, True) for field in fields]
        if not any(hasattr(value, "resolve_expression") for value in values):
            connection = connections[using]
            prepared = [
                field.get_db_prep_save(value, connection=connection)
                for field, value in zip(fields, values, strict=True)
            ]
            return sql, prepared
    query = InsertQuery(model)
    query.insert_values(fields, [obj])
    [(sql, params)] = query.get_compiler(using=using).as_sql()
    plain = all(getattr(field, "get_placeholder", None) is None for field in fields)
    if plain and len(params) == len(fields) and sql.endswith(f"VALUES ({', '.join(['%s'] * len(fields))})"):
        _insert_sql[(model, using)] = sql
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


def execute(statements: list[Statement], using: str = "default") -> None:
    """Send ``statements`` in one query: one round trip, one transaction (all or nothing)."""
    if not available(using):
        raise RuntimeError("one_round_trip.execute needs PostgreSQL in autocommit (outside atomic blocks)")
    sql = ";\n".join(statement for statement, _ in statements)
    params = [param for _, statement_params in statements for param in statement_params]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
