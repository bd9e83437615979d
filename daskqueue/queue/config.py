"""``PoolConfig``: a queue pool's settings, validated once, from which its queue actors'
arguments derive. The defaults live in ``daskqueue/defaults.py``; ``QueuePool`` documents them.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from daskqueue import defaults
from daskqueue.errors import ConfigurationError
from daskqueue.messages import MAX_QUEUES
from daskqueue.queue.policy import Scheduler, TypePolicy
from daskqueue.segment.format import CHUNK_HEADER, CHUNK_PRODUCER, FILE_HEADER, LOG_RECORD_HEADER, PAYLOAD_OFFSET
from daskqueue.validate import check_choice, check_number

__all__ = ["PoolConfig", "Durability", "FsyncPolicy", "CHUNK_RECORD_OVERHEAD", "default_n_queues"]

Durability = Literal["transient", "durable"]
FsyncPolicy = Literal["always", "interval", "never"]

#: Bytes of a log segment that a CHUNK record of one message takes besides the message's
#: payload and the chunk's type and key strings: the segment's file header, the record header,
#: the chunk header, the producer tag a put of a producer other than the owner carries (counted
#: always: a client cannot know which producer's put a message's limit is checked for), and the
#: message's two payload offsets (``segment/FORMAT.md``).
CHUNK_RECORD_OVERHEAD: int = (
    FILE_HEADER.size + LOG_RECORD_HEADER.size + CHUNK_HEADER.size + CHUNK_PRODUCER.size + 2 * PAYLOAD_OFFSET.size
)


def default_n_queues(slots: int) -> int:
    """How many queues a transient pool gets when ``n_queues`` is not given, for a cluster of
    ``slots`` worker threads in all (the scale model, ``defaults.QUEUE_CALLS_PER_S``): enough
    that each queue serves at most ``QUEUE_CALLS_PER_S`` consumer calls per second when every
    slot runs batches of ``TARGET_BATCH_S``, at least 1, at most ``MAX_DEFAULT_QUEUES``.
    A cluster with no worker yet (adaptive, a batch system) gets 1: ``add_queues`` adds more."""
    calls_per_s = max(0, slots) * 2 / defaults.TARGET_BATCH_S
    return max(1, min(defaults.MAX_DEFAULT_QUEUES, math.ceil(calls_per_s / defaults.QUEUE_CALLS_PER_S)))


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The settings of a ``QueuePool``; constructing one validates it (:meth:`validate`).

    ``max_message_bytes`` is what the user asked for; :meth:`message_limit` is what a message
    may really take (a durable queue's message must also fit in one log segment).
    """

    n_queues: int = 1
    durability: Durability = "transient"
    lease_timeout_s: float = defaults.LEASE_TIMEOUT_S
    max_retries: int = defaults.MAX_RETRIES
    retry_backoff_base_s: float = defaults.RETRY_BACKOFF_BASE_S
    retry_backoff_max_s: float = defaults.RETRY_BACKOFF_MAX_S
    max_message_bytes: int = defaults.MAX_MESSAGE_BYTES
    put_batch_size: int = defaults.PUT_BATCH_MESSAGES
    dirpath: str | None = None
    fsync: FsyncPolicy = "interval"
    fsync_interval_s: float = defaults.FSYNC_INTERVAL_S
    max_segment_bytes: int = defaults.MAX_SEGMENT_BYTES
    compact_index_bytes: int = defaults.COMPACT_INDEX_BYTES
    scheduler: Scheduler = "fifo"
    max_type_share: float = defaults.MAX_TYPE_SHARE
    max_scan: int = defaults.MAX_SCAN
    max_type_cap: int | None = None
    type_caps: Mapping[str, int] = field(default_factory=dict)
    dir_mode: int = defaults.DIR_MODE

    @classmethod
    def from_options(cls, n_queues: int = 1, *, dirpath: str | os.PathLike[str] | None = None,
                     **options: Any) -> PoolConfig:
        """The config of ``QueuePool(client, n_queues, **options)``, with ``dirpath`` made
        absolute (the workers may not share the client's working directory). Raises
        :class:`ConfigurationError` naming the first bad value."""
        if dirpath is not None:
            dirpath = os.path.abspath(os.fspath(dirpath))
        return cls(n_queues, dirpath=dirpath, **options)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad value."""
        check_number("n_queues", self.n_queues, integer=True, at_least=1, at_most=MAX_QUEUES)
        check_choice("durability", self.durability, ("transient", "durable"))
        if self.durability == "durable" and self.dirpath is None:
            raise ConfigurationError("durability='durable' needs dirpath= (a directory the workers can see)")
        if self.durability == "transient" and self.dirpath is not None:
            raise ConfigurationError("dirpath= is only for durability='durable'")
        check_choice("fsync", self.fsync, ("always", "interval", "never"))
        check_number("fsync_interval_s", self.fsync_interval_s, above=0)
        check_number("max_segment_bytes", self.max_segment_bytes, integer=True,
                     at_least=defaults.MIN_SEGMENT_BYTES)
        check_number("compact_index_bytes", self.compact_index_bytes, integer=True, above=0)
        check_number("dir_mode", self.dir_mode, integer=True, at_least=0o700, at_most=0o777)
        check_number("lease_timeout_s", self.lease_timeout_s, above=0)
        check_number("max_retries", self.max_retries, integer=True, at_least=0)
        check_number("retry_backoff_base_s", self.retry_backoff_base_s, at_least=0)
        check_number("retry_backoff_max_s", self.retry_backoff_max_s, at_least=0)
        check_number("max_message_bytes", self.max_message_bytes, integer=True, above=0)
        check_number("put_batch_size", self.put_batch_size, integer=True, above=0)
        check_choice("scheduler", self.scheduler, ("fifo", "fair", "capped"))
        check_number("max_type_share", self.max_type_share, above=0, at_most=1)
        check_number("max_scan", self.max_scan, integer=True, at_least=1)
        if self.max_type_cap is not None:
            check_number("max_type_cap", self.max_type_cap, integer=True, at_least=1)
        if not isinstance(self.type_caps, Mapping):
            raise ConfigurationError(f"type_caps must be a dict {{type: cap}}, got {self.type_caps!r:.80}")
        for t, cap in self.type_caps.items():
            if not isinstance(t, str):
                raise ConfigurationError(f"type_caps keys must be type names (str), got {t!r:.80}")
            check_number(f"type_caps[{t!r}]", cap, integer=True, at_least=1)
        if self.scheduler != "capped" and (self.max_type_cap is not None or self.type_caps):
            raise ConfigurationError(f"max_type_cap and type_caps need scheduler='capped', got {self.scheduler!r}")

    @property
    def policy(self) -> TypePolicy:
        """The queues' type-scheduling policy."""
        return TypePolicy(self.scheduler, self.max_type_share, self.max_scan, self.max_type_cap,
                          dict(self.type_caps))

    def message_limit(self, type: str | None = None, key: str | None = None) -> int:
        """The largest pickled payload one message of a put with this ``type`` and ``key`` may
        have: ``max_message_bytes``, and for a durable queue what one log segment can hold
        (a message's CHUNK record never spans segments)."""
        if self.durability != "durable":
            return self.max_message_bytes
        strings = len((type or "").encode()) + len((key or "").encode())
        return min(self.max_message_bytes, self.max_segment_bytes - CHUNK_RECORD_OVERHEAD - strings)

    def queue_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of each queue actor (after its index, and a durable one's
        directory)."""
        kwargs: dict[str, Any] = dict(
            lease_timeout_s=self.lease_timeout_s,
            max_retries=self.max_retries,
            retry_backoff_base_s=self.retry_backoff_base_s,
            retry_backoff_max_s=self.retry_backoff_max_s,
            max_message_bytes=self.message_limit(),
        )
        if self.scheduler != "fifo":
            kwargs["policy"] = self.policy
        if self.durability == "durable":
            kwargs.update(
                fsync=self.fsync, fsync_interval_s=self.fsync_interval_s,
                max_segment_bytes=self.max_segment_bytes, compact_index_bytes=self.compact_index_bytes,
                dir_mode=self.dir_mode,
            )
        return kwargs

    def as_dict(self) -> dict[str, Any]:
        """Every setting, by name (what the pool actor holds)."""
        return asdict(self)
