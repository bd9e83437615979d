"""On-disk storage for ``DurableQueue``: log segments, the index and their recovery.

The byte layout, checksums, file naming, durability settings and recovery rules are specified
in ``FORMAT.md`` next to this file (shipped in the wheel); the modules follow it:

- ``format``: one ``struct.Struct`` per record of FORMAT.md, and the one checksum function.
- ``log``: ``LogSegment``, the append-only files of message payloads.
- ``index``: ``IndexSegment``, the write-ahead log of state transitions.
- ``recovery``: replay of index records into the state to restore (pure, no I/O of its own).
- ``store``: ``SegmentStore``, one queue directory of segments and an index, with its lock;
  its jobs: ``lockfile`` (marker and lock), ``opening`` (recovery rules 1-5 and 9 at open),
  ``durability`` (the sync thread, what is due, the failure latch), ``lifetimes`` (which
  segments may be deleted).
"""
