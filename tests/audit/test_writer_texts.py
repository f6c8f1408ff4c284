"""The writer encodes an entry's refs and payload once: the texts it stores and hashes are the
ones the slow way (encode, parse, clean, encode again) gives, for any value."""

from __future__ import annotations

import json
import random
import uuid
from decimal import Decimal

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from audit import writer
from audit.models import AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_chain

AWKWARD = [
    {},
    {"run": "5f0c", "step": "s0"},
    {"b": 1, "a": [1, 2.5, None, True, False], "c": {"z": "ünïcode \u2603", "y": 'tab\t"quote"\\'}},
    {10: "ten", 9: "nine", 100: "hundred"},  # keys that are not strings: sorted otherwise once parsed
    {True: "bool key", False: "false key"},
    {1.5: "float key", 10.25: "another", -3.0: "negative"},
    {"nul": "a\x00b", "k\x00": 1},
    {"surrogate": "\ud800", "\udfff": "key"},
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")},
    {"neg_zero": -0.0, "neg_small": -0.05, "zero": 0.0, "five": 5.0},
    {"big": 1e16, "bigger": 1e100, "just_below": 9999999999999998.0, "tiny": 1e-7, "huge_int": 2**70},
    {"text": "looks like NaN, Infinity, e+5, -0.0 and \\u0000 but is text"},
    {"when": timezone.now(), "id": uuid.uuid4(), "amount": Decimal("1.10"), "tuple": (1, "two")},
    {"nested": [{"b": 2, "a": 1}, [{"d": {"f": 1, "e": 2}}]]},
]


def _slow(value):
    clean = writer._clean(json.loads(writer.canonical_json(value)))
    return clean, writer.canonical_json(clean)


@pytest.mark.parametrize("value", AWKWARD, ids=range(len(AWKWARD)))
def test_the_text_and_the_copy_are_the_slow_way_s(value):
    clean, text = writer._jsonable_text(value)
    expected_clean, expected_text = _slow(value)
    assert text == expected_text
    assert writer.canonical_json(clean) == expected_text


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(["", "a", "é", "\x00", "\ud834", "\n", '"', "\\", "NaN", "e+1", "-0.0", "z" * 20])
    if kind == 1:
        return rng.choice([0, -1, 7, 2**64, -(2**70)])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1.5, -2.25, 1e15, 1e16, 3e21, 1e-9, float("nan"), float("inf")])
    if kind in (3, 4, 5):
        return rng.choice([None, True, False])
    if kind in (6, 7):
        keys = rng.choice([["a", "b", "B", "é", "10", "9", "1", "\x00"], [9, 10, 1, -5, 100], [True, False]])
        keys = [rng.choice(keys) for _ in range(4)]
        return {key: _random_value(rng, depth + 1) for key in keys}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_random_values_give_the_slow_way_s_text():
    rng = random.Random(11)
    for _ in range(3000):
        value = {"v": _random_value(rng)}
        assert writer._jsonable_text(value)[1] == _slow(value)[1], value
        assert writer.canonical_json(value) == writer._ENCODER.encode(value)


@pytest.mark.parametrize("value", [*AWKWARD, "top-level text\x00", 1.5, None, [3, {"b": 1, "a": 2}]])
def test_canonical_json_is_the_encoder_s_json(value):
    encoder = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert writer.canonical_json(value) == encoder.encode(value)


def test_a_value_that_contains_itself_is_refused():
    value: dict = {"a": 1}
    value["self"] = value
    with pytest.raises((ValueError, RecursionError)):
        writer.canonical_json(value)


def test_the_spliced_entry_hash_is_the_entry_hash():
    fields = writer._fields(trace_id="t", type="step.succeeded", summary="s0 succeeded: ünï \x00",
                            workspace_id=None, refs={"run": "r", "2": "x"}, actor='worker:"vm":1',
                            payload={"cost_usd": "0", "z": [1.5, -0.0]})  # fmt: skip
    assert fields["entry_hash"] == writer.entry_hash(fields)
    stored = writer._event(fields)
    assert (
        writer.entry_hash({name: getattr(stored, name) for name in writer.CONTENT_FIELDS})
        == fields["entry_hash"]
    )


@pytest.mark.django_db
@pytest.mark.unsequenced
def test_awkward_entries_of_a_batch_are_stored_as_hashed_and_sequenced_into_a_verified_chain():
    # given awkward refs and payloads appended in one batch, as a worker appends a run's entries
    with transaction.atomic(), writer.batch():
        events = [
            writer.append(
                trace_id="t",
                type="test.awkward",
                summary=f"#{i}",
                workspace_id=41,
                refs=value,
                payload={"value": value},
            )  # fmt: skip
            for i, value in enumerate(AWKWARD)
        ]
    # then each row holds what append returned, and the sequencer chains every entry (it
    # refuses an entry whose stored content does not hash to its sealed entry_hash)
    rows = list(AuditEvent.objects.filter(chain="ws-41").order_by("id"))
    assert [(row.refs, row.payload) for row in rows] == [(event.refs, event.payload) for event in events]
    assert sequence_pending() == len(AWKWARD)
    result = verify_chain("ws-41")
    assert (result.ok, result.events, result.waiting) == (True, len(AWKWARD), 0)
