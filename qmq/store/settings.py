# -*- test-case-name: tests.test_config,tests.test_service -*-
"""Settings of the commit-log store: the C{[commit_log]} table.

Read only when the configuration chooses the commit log (C{store = "log"});
L{qmq.service} then builds a L{qmq.store.log.CommitLogStore} in
C{DATA_DIR/log} from them.  The table is not called C{[store]}: TOML cannot
give one key both a string (C{store = "log"}) and a table.

L{qmq.config} registers L{CommitLogSettings} under C{"commit_log"} in its
C{SECTIONS} and derives the table's schema from the fields (type annotation:
the TOML type; C{metadata}: the allowed range).  The defaults here are the
documented defaults (C{qmq/default.toml} repeats them; a test sees that they
agree, and that C{FSYNC_POLICIES} is the store's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FSYNC_POLICIES", "CommitLogSettings"]

MiB = 1024 * 1024

#: The fsync policies, as L{qmq.store.log.FSYNC_POLICIES} (repeated so that
#: reading the configuration does not load the store).
FSYNC_POLICIES = ("always", "interval", "never")


@dataclass(frozen=True)
class CommitLogSettings:
    """How the commit log writes (see docs/storage.rst).

    @ivar fsync: C{"always"}: a persistent message is confirmed (its
        RECEIPT sent) only after the write holding it was synced;
        C{"interval"}: written every reactor turn, synced at most
        C{fsync_interval_ms} apart, confirmed at once; C{"never"}: the
        operating system decides when data reaches the disk.
    @ivar fsync_interval_ms: with C{"interval"}, the most milliseconds
        between two syncs.
    @ivar segment_size: bytes after which a segment file is closed and the
        next one begun (a record is never split).
    @ivar compact_ratio: an old segment whose live records are at most this
        part of its records is compacted (its live records copied forward,
        the file deleted); 0 turns compaction off.
    @ivar backlog_memory: a durable queue whose ready messages hold more
        body bytes than this leaves the bodies (and headers) of persistent
        messages published to it then on disk, once written, and reads them
        back as consumers reach them; recovery does the same past it. 0
        keeps every body in memory.
    """

    fsync: str = field(
        default="always",
        metadata={"choices": FSYNC_POLICIES, "expected": '"always", "interval" or "never"'},
    )
    fsync_interval_ms: int = field(default=100, metadata={"min": 1})
    segment_size: int = field(default=64 * MiB, metadata={"min": 4096})
    compact_ratio: float = field(default=0.25, metadata={"min": 0, "max": 1})
    backlog_memory: int = field(default=16 * MiB, metadata={"min": 0})
