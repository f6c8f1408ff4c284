"""The append-only, hash-chained audit ledger (SPEC §9).

Rows are written only by :mod:`audit.writer` (plain inserts of unsequenced
entries) and sequenced only by :mod:`audit.sequencer` (the one-time fill of
``seq``, ``prev_hash`` and ``hash``). The database itself refuses every other
UPDATE and every DELETE on ``audit_auditevent`` (triggers of migration 0005).
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KeyTextTransform, KeyTransform, KeyTransformFactory
from django.db.models.functions import Left
from django.utils.functional import cached_property


class HexHashField(models.CharField):
    """A sha256 digest: 64 hex characters to Python, the API and exports; its 32 bytes in the database.

    Stored as ``bytea`` (PostgreSQL) / BLOB (SQLite), half the size of the hex text in
    the row and in any index. ``""`` (the entry hash of rows written before the
    sequencer existed) is stored as empty bytes.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", 64)
        super().__init__(*args, **kwargs)

    def get_internal_type(self) -> str:
        return "BinaryField"

    def from_db_value(self, value, expression, connection):
        if value is None or isinstance(value, str):
            return value
        return bytes(value).hex()

    def get_db_prep_value(self, value, connection, prepared=False):
        value = super().get_db_prep_value(value, connection, prepared)
        if value is None or isinstance(value, bytes | memoryview):
            return value
        return bytes.fromhex(value)


# audit.writer.canonical_json's serialisation (defined here too: the writer imports the models).
_CANONICAL = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CanonicalJSONField(models.JSONField):
    """JSON stored as the very text the writer hashed: ``json`` on PostgreSQL, which keeps its
    text verbatim (``jsonb`` would re-serialise it), so that verification can hash the stored
    text in SQL (audit/verify.py). Values are written in canonical JSON (sorted keys, no
    whitespace, non-ASCII kept). SQLite is unchanged (JSON text either way).

    ``json`` has no equality operator and none of ``jsonb``'s containment operators: compare
    ``::text``, and filter on ``->>`` (``KeyTextTransform``), as audit.selectors does.
    """

    def db_type(self, connection):
        return "json" if connection.vendor == "postgresql" else super().db_type(connection)

    def get_transform(self, name):
        transform = super().get_transform(name)
        return _JsonbKeyFactory(name) if isinstance(transform, KeyTransformFactory) else transform

    def from_db_value(self, value, expression, connection):
        if value is not None and not isinstance(value, str):
            return value  # psycopg parses ``json`` itself
        return super().from_db_value(value, expression, connection)

    def get_db_prep_value(self, value, connection, prepared=False):
        if connection.vendor != "postgresql":
            return super().get_db_prep_value(value, connection, prepared)
        if not prepared:
            value = self.get_prep_value(value)
        if hasattr(value, "as_sql"):
            return value
        # psycopg's Json (not Jsonb, which Django's own adapt_json_value gives): sent as ``json``, verbatim.
        return connection.Database.types.json.Json(value, dumps=_CANONICAL.encode)


class _JsonbKey(KeyTransform):
    """``refs__step="a"``-style lookups on a ``json`` column: read as ``jsonb`` (``json`` has no ``=``).

    A parse per row, so for small sets; the lists filter on ``->>`` through an index
    (audit.selectors)."""

    @cached_property
    def output_field(self):
        return _JsonbValue()

    def preprocess_lhs(self, compiler, connection):
        lhs, params, keys = super().preprocess_lhs(compiler, connection)
        return (f"({lhs})::jsonb" if connection.vendor == "postgresql" else lhs), params, keys


class _JsonbValue(models.JSONField):
    """What a key of a CanonicalJSONField is in a lookup: ``jsonb`` (its values compared as ``jsonb``)."""

    def get_transform(self, name):
        transform = super().get_transform(name)
        return _JsonbKeyFactory(name) if isinstance(transform, KeyTransformFactory) else transform


class _JsonbKeyFactory(KeyTransformFactory):
    def __call__(self, *args, **kwargs):
        return _JsonbKey(self.key_name, *args, **kwargs)


class Outcome(models.TextChoices):
    SUCCESS = "success"
    FAILURE = "failure"
    SUPPRESSED = "suppressed"
    INFO = "info"


# Characters of trace ids and run references indexed: 7 fill an index key's 8 bytes (a 1-byte
# text header), so (prefix, id) is a 24-byte index tuple. Ids are random (uuid4), 7 hex
# characters tell ~268M apart; a caller-chosen trace id with a long common prefix would make
# its lookups walk every row of that prefix (still in id order, never a sort).
KEY_PREFIX = 7


# The type of a truncation anchor (audit.checkpoints.ANCHOR_TYPE, frozen in migrations 0008-0012).
ANCHOR_TYPE = "audit.anchor"


class TypeKey(models.Func):
    """PostgreSQL's ``hashtext()`` of an event type: the 4-byte key of audit_type_key_idx."""

    function = "hashtext"
    output_field = models.IntegerField()


class TypeKeyIndex(models.Index):
    """(hashtext(type), id) on PostgreSQL; elsewhere (SQLite has no hashtext) the plain (type, id)."""

    def create_sql(self, model, schema_editor, using="", **kwargs):
        if schema_editor.connection.vendor != "postgresql":
            plain = models.Index(fields=["type", "id"], name=self.name)
            return plain.create_sql(model, schema_editor, using=using, **kwargs)
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class AuditEvent(models.Model):
    chain = models.CharField(max_length=64)
    # seq, prev_hash and hash are NULL until the sequencer integrates the entry.
    seq = models.PositiveBigIntegerField(null=True, blank=True)
    timestamp = models.DateTimeField()
    trace_id = models.CharField(max_length=64)
    stage = models.CharField(max_length=32, blank=True, default="")
    type = models.CharField(max_length=64)
    summary = models.CharField(max_length=500)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.INFO)
    # No foreign keys: audit depends on no other app, and a ledger row must
    # outlive whatever it describes.
    workspace_id = models.BigIntegerField(null=True, blank=True)
    # Stored as the canonical text the hashes were taken over (CanonicalJSONField).
    refs = CanonicalJSONField(default=dict, blank=True)
    actor = models.CharField(max_length=200, default="system")
    payload = CanonicalJSONField(default=dict, blank=True)
    prev_hash = HexHashField(null=True, blank=True)
    # Not unique: (chain, seq) is, and the hash covers both; a unique index on random
    # digests cost ~1 KB per run and no query looks an event up by its hash alone.
    hash = HexHashField(null=True, blank=True)
    # sha256 of the entry's content, sealed at append (see audit.writer.entry_hash):
    # the sequencer refuses to chain an entry whose content no longer matches it, and clears
    # it when it chains the entry (the hash covers the same content from then on; migration
    # 0012). Set on waiting entries, and on entries sequenced before 0012.
    entry_hash = HexHashField(blank=True, default="")

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq")]
        indexes = [
            # Trace id and run reference on a short prefix, then id: a third of the index of the
            # whole value, and still in id order for the lists' keyset pages. Queries match the
            # prefix and re-check the full value (audit.selectors.of_trace / of_run).
            models.Index(Left("trace_id", KEY_PREFIX), F("id"), name="audit_trace_prefix_idx"),
            # hashtext(type), then id: a 24-byte index tuple instead of 32 (the type's text, padded to
            # the id's alignment); queries match the hash and re-check the type (audit.selectors.of_type).
            TypeKeyIndex(TypeKey("type"), F("id"), name="audit_type_key_idx"),
            # A chain's anchors (its newest one starts verification and export; the guard's DELETE check).
            models.Index(
                fields=["chain", "seq"],
                condition=Q(type=ANCHOR_TYPE, seq__isnull=False),
                name="audit_anchor_idx",
            ),
            models.Index(fields=["workspace_id", "id"], name="audit_workspace_idx"),
            # The run reference's prefix alone: a run's few events share one key, so deduplication
            # keeps them as one index tuple (a posting list of their row ids) instead of one
            # (prefix, id) tuple each. A run's events come back as a bitmap scan and a sort of those
            # few rows (audit.selectors.of_run). Not partial: the planner only uses the statistics
            # of a whole index's expression (a partial one's estimate was 0.5% of the table).
            models.Index(Left(KeyTextTransform("run", "refs"), KEY_PREFIX), name="audit_run_ref_key_idx"),
            models.Index(fields=["chain", "id"], condition=Q(seq__isnull=True), name="audit_unsequenced_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq if self.seq is not None else '(waiting)'} {self.type}"

    @property
    def sequenced(self) -> bool:
        return self.seq is not None


class AuditChainHead(models.Model):
    """The sequenced head of one chain. Only the sequencer moves it (appends never touch it)."""

    chain = models.CharField(max_length=64, unique=True)
    seq = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="0" * 64)
    # The head before the last append and that append's time: kept so that one
    # UPDATE ... RETURNING can hand both to the new event (PostgreSQL returns new
    # values only), and so timestamps never go backwards along a chain.
    prev_hash = models.CharField(max_length=64, default="0" * 64)
    last_timestamp = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.chain} @ {self.seq}"


class AuditCheckpoint(models.Model):
    """An Ed25519-signed statement of a chain's head, so a truncated tail is detectable."""

    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    head_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    key_id = models.CharField(max_length=64)
    signature = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["chain", "id"], name="audit_checkpoint_chain_idx")]

    def __str__(self) -> str:
        return f"checkpoint {self.chain}#{self.seq}"


class AuditVerification(models.Model):
    """The last verification of one chain: what ``GET /api/v1/audit/verify`` serves.

    Written by :func:`audit.verify.verification_record` (the periodic task, a stale read, a
    full walk an admin asked for). A broken result stays until a full walk finds the chain
    intact: an incremental walk starts above the damage and would not see it."""

    chain = models.CharField(max_length=64, unique=True)
    ok = models.BooleanField(default=True)
    events = models.PositiveBigIntegerField(default=0)
    checkpoints = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    broken = models.JSONField(null=True, blank=True)
    full = models.BooleanField(default=False, help_text="whether the last walk was a full one")
    verified_at = models.DateTimeField(null=True, blank=True)
    full_verified_at = models.DateTimeField(null=True, blank=True)
    # When the last full walk through the API started: the rate limit's claim.
    full_requested_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"verification of {self.chain}"
