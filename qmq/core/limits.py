# -*- test-case-name: tests.test_config -*-
"""Broker-wide limits: the C{[limits]} table of the configuration.

These bound what the whole broker holds, whatever protocol brought it in;
a frontend's own per-connection limits live in its settings (C{[stomp]}).
L{qmq.config} reads the table into a L{LimitSettings}: each field's type
annotation gives the TOML type, its C{metadata} the allowed range (see
L{qmq.config} for the keys), so a field added here is checked, merged and
built without touching the configuration code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LimitSettings", "check_disk_limit", "check_memory_mark"]

MiB = 1024 * 1024


def check_memory_mark(value: int | float | str) -> int | float | str:
    """
    Check a memory high-water mark as the configuration gives it.

    The mark is kept as written: the alarm turns it into bytes when the
    broker starts, against the memory of the machine it runs on.  Here it is
    tried against this machine's memory with
    L{qmq.core.alarm.parse_memory_mark}, so that a malformed mark stops the
    start with a configuration error rather than later.

    @param value: an integer number of bytes, a fraction of memory (a
        decimal number C{0 < f <= 1}, or a string C{"40%"}), a size string
        (C{"512MiB"}, C{"2GB"}), or C{0} (or C{"off"}) to turn the alarm off.
    @return: C{value}, unchanged.
    @raise ValueError: the mark is malformed; the message says why.
    """
    # Imported here: describing the settings does not need the alarm (nor
    # Twisted), only checking a value does.
    from qmq.core.alarm import parse_memory_mark, total_memory  # noqa: PLC0415

    try:
        total = total_memory()
    except OSError:
        total = 0  # a fraction is then refused, with the alarm's reason
    parse_memory_mark(value, total)
    return value


def check_disk_limit(value: int | float | str) -> int | float | str:
    """
    Check a disk free-space limit as the configuration gives it (see
    L{qmq.core.alarm.parse_disk_limit}); a fraction is resolved against the
    data directory's filesystem when the alarm first samples it.

    @return: C{value}, unchanged.
    @raise ValueError: the limit is malformed; the message says why.
    """
    from qmq.core.alarm import parse_disk_limit  # noqa: PLC0415

    parse_disk_limit(value, 0)
    return value


@dataclass(frozen=True)
class LimitSettings:
    """Limits of the broker as a whole.

    @ivar memory_high_watermark: above this much memory in use (the
        process's resident set) the broker stops reading from connections
        that publish (publisher flow control), and reads again once use
        falls below 90% of it; consumers keep draining meanwhile.  A
        fraction of physical memory or of the cgroup limit (a decimal
        number C{0 < f <= 1}, or C{"40%"}), a size (C{"512MiB"}, C{"2GB"},
        or an integer number of bytes), or C{0} to turn the alarm off.  See
        L{qmq.core.alarm.parse_memory_mark}.
    @ivar disk_free_limit: below this much free space on the data
        directory's filesystem (with the commit-log store) the broker holds
        back persistent publishes until space is freed; consumers keep
        draining.  A size (C{"50MB"}, C{"2GiB"}, an integer number of
        bytes), a fraction of the filesystem's size (C{0 < f < 1}, or
        C{"5%"}), or C{0} to turn the alarm off.  RabbitMQ's default, 50 MB.
    @ivar max_topic_words: most words (dot-separated parts) in a topic
        binding pattern or a routing key, so that matching stays cheap.
    @ivar max_routing_key_length: longest routing key or binding pattern,
        in characters.
    @ivar max_unfinished_bytes: most bytes of frames and HTTP request
        bodies still being received, over all connections together; a
        frame or a request that would cross it is refused.  0: unlimited.
    """

    memory_high_watermark: int | float | str = field(
        default=0.4,
        metadata={
            "parse": check_memory_mark,
            "expected": 'a fraction of memory (0 < f <= 1), a size such as "512MiB", or 0',
        },
    )
    disk_free_limit: int | float | str = field(
        default="50MB",
        metadata={
            "parse": check_disk_limit,
            "expected": 'a size such as "50MB", a fraction of the filesystem (0 < f < 1), or 0',
        },
    )
    max_topic_words: int = field(default=32, metadata={"min": 1})
    max_routing_key_length: int = field(default=255, metadata={"min": 1})
    max_unfinished_bytes: int = field(default=256 * MiB, metadata={"min": 0})
