# -*- test-case-name: tests.test_core_alarm -*-
"""The broker-wide memory alarm: RabbitMQ's memory high-water mark, ActiveMQ's
producer flow control.

A publisher that outruns every consumer makes the broker grow until the OS
kills it. The alarm stops that: a L{MemoryAlarm} samples the resident set
size (RSS) of the broker process every C{interval} seconds on the clock it is
given. When RSS reaches the high-water mark the alarm is I{raised}:
L{MemoryAlarm.active} becomes C{True}, one warning is logged, and every
subscriber is called with C{True}. Sessions check C{active} on each SEND and
stop reading from publishing connections, so TCP back-pressure holds the
producers while consumers drain the queues. When RSS falls below the
low-water mark the alarm I{clears}: C{active} becomes C{False}, one line is
logged, and subscribers are called with C{False} to resume reading. The gap
between the two marks (hysteresis) keeps the alarm from flapping on every
sample.

RSS overstates live data: glibc keeps freed message bodies in the heap
instead of returning them to the OS, so after a flood of 1-10 KiB messages
is consumed, RSS can stay where it peaked and the alarm would never clear.
So before deciding that memory I{is} high, the alarm asks the allocator to
give free memory back (L{trim_heap}, glibc's C{malloc_trim}) and samples
again. That costs nothing while memory is below the marks and little while
it is genuinely full; it takes time only in proportion to memory just freed.

Around the alarm, three helpers for the configuration: L{current_rss},
L{total_memory} (RAM or the cgroup limit, whichever is smaller) and
L{parse_memory_mark}, which turns C{"2GiB"}, C{0.4} or C{"40%"} into bytes.

The core never imports the reactor: the clock is injected, and tests drive
the alarm with L{twisted.internet.task.Clock} and a fake C{read_rss}.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

log = Logger()

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

DEFAULT_HIGH_WATERMARK = 0.4
"""The proposed default high-water mark: 40% of RAM (or of the cgroup limit).
RabbitMQ's long-standing default; it leaves room for the services the broker
shares the machine with, for the page cache the commit log reads through, and
for the overshoot of a burst that arrives between two samples."""

DEFAULT_LOW_RATIO = 0.9
"""The low-water mark, as a fraction of the high one, when none is given."""

MIN_MARK = 16 * MiB
"""The smallest mark L{parse_memory_mark} accepts. The interpreter alone is
larger, so a smaller mark would block publishing from the start; it is
almost always a unit forgotten (C{high = 512} meant C{"512MiB"})."""

_STATM = "/proc/self/statm"
_MEMINFO = "/proc/meminfo"
_CGROUP_ROOT = "/sys/fs/cgroup"
_SELF_CGROUP = "/proc/self/cgroup"

try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):  # pragma: no cover - no sysconf
    _PAGE_SIZE = 4096


def current_rss() -> int:
    """The resident set size of this process, in bytes.

    Reads C{/proc/self/statm} (a few microseconds). Where there is no
    C{/proc}, falls back to C{getrusage}'s C{ru_maxrss}, which is the
    I{peak} RSS: there an alarm, once raised, clears only if the mark is
    moved.

    @raise OSError: when neither source exists on this platform.
    """
    try:
        with open(_STATM, "rb", buffering=0) as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except OSError:
        pass
    if resource is None:  # pragma: no cover - Windows
        raise OSError("cannot measure the resident set size on this platform")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux and the BSDs count kibibytes, macOS counts bytes.
    return maxrss if sys.platform == "darwin" else maxrss * KiB


def _physical_memory() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if total > 0:
            return total
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open(_MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        pass
    raise OSError("cannot determine the amount of physical memory")


def _cgroup_limit(root: str = _CGROUP_ROOT, self_cgroup: str = _SELF_CGROUP) -> int | None:
    """The smallest memory limit of the cgroups this process is in, or None.

    Reads C{memory.max} (cgroup v2) at C{root} (a container's own cgroup)
    and along this process's cgroup path from C{self_cgroup} (a systemd
    unit's C{MemoryMax=} and the slices above it), and cgroup v1's
    C{memory/memory.limit_in_bytes}. C{"max"} means no limit.
    """
    files = [
        os.path.join(root, "memory.max"),
        os.path.join(root, "memory", "memory.limit_in_bytes"),
    ]
    try:
        with open(self_cgroup, encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    parts = [p for p in line[3:].strip().split("/") if p]
                    for i in range(1, len(parts) + 1):
                        files.append(os.path.join(root, *parts[:i], "memory.max"))
    except OSError:
        pass
    limits = []
    for name in files:
        try:
            with open(name, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits, default=None)


def total_memory() -> int:
    """The memory this process may use, in bytes: physical RAM, or the cgroup
    memory limit when that is a number smaller than RAM.

    @raise OSError: when the amount of RAM cannot be determined.
    """
    total = _physical_memory()
    limit = _cgroup_limit()
    if limit is not None and 0 < limit < total:
        return limit
    return total


_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 10**3,
    "m": MiB,
    "mib": MiB,
    "mb": 10**6,
    "g": GiB,
    "gib": GiB,
    "gb": 10**9,
    "t": TiB,
    "tib": TiB,
    "tb": 10**12,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_FORMS = (
    "expected a size (bytes as an integer, or a string like '512MiB', '2GB', '1.5GiB', '800M'), "
    "a fraction of memory (0 < f <= 1, like 0.4, or a string like '40%'), or 0 / 'off' to disable"
)


def _fraction(fraction: float, total: int, value: object) -> int:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(
            f"memory mark {value!r}: a fraction of memory must be > 0 and <= 1; {_FORMS}"
        )
    if total <= 0:
        raise ValueError(f"memory mark {value!r}: the total memory is unknown, give a size instead")
    return int(total * fraction)


def parse_memory_mark(value: int | float | str, total: int) -> int:
    """Turn a configured memory mark into bytes; 0 means disabled.

    Accepted forms:
      - an C{int}: bytes (C{2147483648});
      - a C{float} C{0 < f <= 1}: that fraction of C{total} (C{0.4}), as
        RabbitMQ's C{vm_memory_high_watermark.relative};
      - a string with a unit, case-insensitive, as RabbitMQ reads them:
        C{K}/C{KiB}, C{M}/C{MiB}, C{G}/C{GiB}, C{T}/C{TiB} are powers of
        1024, C{KB}, C{MB}, C{GB}, C{TB} powers of 1000, C{B} or no unit
        bytes (C{"512MiB"}, C{"2GB"}, C{"1.5GiB"}, C{"800M"});
      - a string percentage of C{total} (C{"40%"});
      - a string without a unit reads as the number would (C{"0.4"} is a
        fraction, C{"2147483648"} bytes), so command-line values match
        TOML ones;
      - C{0}, C{0.0}, C{"0"} or C{"off"}: disabled.

    @param value: the configured value.
    @param total: the memory fractions refer to, in bytes (L{total_memory}).
    @return: the mark in bytes, or 0 for disabled.
    @raise ValueError: for anything else, including marks below L{MIN_MARK}
        and fractions above 1; the message says what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"memory mark {value!r}: {_FORMS}")
    if isinstance(value, int):
        mark = value
    elif isinstance(value, float):
        mark = 0 if value == 0.0 else _fraction(value, total, value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text == "off":
            return 0
        if m := _PERCENT.fullmatch(text):
            percent = float(m.group(1))
            mark = 0 if percent == 0.0 else _fraction(percent / 100.0, total, value)
        elif m := _SIZE.fullmatch(text):
            number, unit = m.groups()
            if unit not in _UNITS:
                raise ValueError(f"memory mark {value!r}: unknown unit {unit!r}; {_FORMS}")
            if not unit and "." in number:
                mark = 0 if float(number) == 0.0 else _fraction(float(number), total, value)
            else:
                mark = (
                    int(float(number) * _UNITS[unit])
                    if "." in number
                    else int(number) * _UNITS[unit]
                )
        else:
            raise ValueError(f"memory mark {value!r}: {_FORMS}")
    else:
        raise ValueError(f"memory mark {value!r} is a {type(value).__name__}; {_FORMS}")
    if mark == 0:
        return 0
    if mark < 0:
        raise ValueError(f"memory mark {value!r} is negative; {_FORMS}")
    if mark < MIN_MARK:
        raise ValueError(
            f"memory mark {value!r} is {mark} bytes, below the minimum of {MIN_MARK // MiB} MiB "
            "(the broker alone uses more, so publishing would stay blocked); "
            "did you forget a unit ('512MiB') or mean a fraction (0.4, '40%')?"
        )
    return mark


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes  # noqa: PLC0415

        malloc_trim = ctypes.CDLL(None).malloc_trim
    except Exception:  # not glibc: musl, macOS, Windows
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim


_malloc_trim = _load_malloc_trim()


def trim_heap() -> None:
    """Give the heap's free memory back to the OS (glibc's C{malloc_trim(0)});
    a no-op where the C library has no such call."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class _Alarm:
    """What every alarm shares: C{active} and the subscribers told of each
    change (in the order they subscribed)."""

    __slots__ = ("active", "_subscribers")

    def __init__(self) -> None:
        self.active = False
        # A dict, not a set: O(1) either way, and callbacks run in the order
        # they subscribed.
        self._subscribers: dict[Callable[[bool], object], None] = {}

    def subscribe(self, callback: Callable[[bool], object]) -> None:
        """Call C{callback(True)} when the alarm is raised and
        C{callback(False)} when it clears, until L{unsubscribe}. Subscribing
        twice is the same as once. Read L{active} for the state now."""
        self._subscribers[callback] = None

    def unsubscribe(self, callback: Callable[[bool], object]) -> None:
        """Stop calling C{callback}; a callback not subscribed is ignored.
        Safe from inside a callback."""
        self._subscribers.pop(callback, None)

    def _change(self, active: bool) -> None:
        self.active = active
        # A copy, so callbacks may subscribe and unsubscribe; the membership
        # test skips one unsubscribed by an earlier callback.
        subscribers = self._subscribers
        for callback in list(subscribers):
            if self.active is not active:
                # A callback re-entered check() and changed the state again;
                # that call has told everyone the newer state.
                break
            if callback not in subscribers:
                continue
            try:
                callback(active)
            except Exception:
                log.failure("{alarm} subscriber {callback!r} failed",
                            alarm=type(self).__name__, callback=callback)


class MemoryAlarm(_Alarm):
    """Raised while the broker's RSS is high; subscribers hear every change.

    @ivar active: C{True} while the alarm is raised. A plain attribute,
        read by sessions on every SEND; it is updated before subscribers
        are called.
    @ivar high: the high-water mark in bytes; 0 when disabled.
    @ivar low: the low-water mark in bytes; 0 when disabled.
    @ivar interval: seconds between samples while started.
    @ivar rss: the last sample, in bytes (0 before the first).
    @ivar peak: the largest sample so far, in bytes.
    @ivar raised_count: how many times the alarm has been raised.
    """

    __slots__ = (
        "high",
        "low",
        "interval",
        "rss",
        "peak",
        "raised_count",
        "_clock",
        "_read_rss",
        "_trim",
        "_loop",
        "_sample_failed",
    )

    def __init__(
        self,
        clock: IReactorTime,
        high: int,
        low: int | None = None,
        interval: float = 0.1,
        read_rss: Callable[[], int] = current_rss,
        trim: Callable[[], object] | None = trim_heap,
    ) -> None:
        """
        @param clock: where the sampling loop's time comes from.
        @param high: the high-water mark in bytes; 0 or less disables the
            alarm (it never raises, and L{start} schedules nothing).
        @param low: the low-water mark in bytes, below which a raised alarm
            clears; default L{DEFAULT_LOW_RATIO} of C{high}. Must be
            C{0 < low <= high}.
        @param interval: seconds between samples while started; the default
            0.1 s costs about 0.01% of a core and lets a flood overshoot the
            mark by a tenth of a second's worth of input at most.
        @param read_rss: returns the current RSS in bytes.
        @param trim: returns free heap memory to the OS; called before a
            sample is allowed to keep or raise the alarm. None to never trim.
        @raise ValueError: for a bad C{low} or C{interval}.
        """
        if interval <= 0:
            raise ValueError(f"memory alarm interval must be positive, not {interval!r}")
        if high <= 0:
            high = low = 0
        elif low is None:
            low = int(high * DEFAULT_LOW_RATIO)
        elif not 0 < low <= high:
            raise ValueError(
                f"memory low-water mark {low} must be positive and at most the high-water mark {high}"
            )
        super().__init__()
        self.high = high
        self.low = low
        self.interval = interval
        self.rss = 0
        self.peak = 0
        self.raised_count = 0
        self._clock = clock
        self._read_rss = read_rss
        self._trim = trim
        self._loop: LoopingCall | None = None
        self._sample_failed = False

    @property
    def enabled(self) -> bool:
        """Whether the alarm can be raised at all (C{high > 0})."""
        return self.high > 0

    def start(self) -> None:
        """Sample now and every C{interval} seconds. Does nothing when
        disabled or already started."""
        if self._loop is not None:
            return
        if self.high <= 0:
            log.info("Memory alarm disabled: no memory high-water mark")
            return
        log.info(
            "Memory alarm on: high-water mark {high_mib:.0f} MiB, low-water mark "
            "{low_mib:.0f} MiB, sampled every {interval}s",
            high=self.high,
            low=self.low,
            high_mib=self.high / MiB,
            low_mib=self.low / MiB,
            interval=self.interval,
        )
        loop = self._loop = LoopingCall(self.check)
        loop.clock = self._clock
        loop.start(self.interval, now=True).addErrback(
            lambda failure: log.failure("memory alarm sampling stopped", failure)
        )

    def stop(self) -> None:
        """Stop sampling; idempotent. A raised alarm is cleared (subscribers
        get C{False}): with nobody sampling, nothing would ever clear it and
        blocked publishers would wait forever. Stop it after closing
        connections at shutdown."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()
        if self.active:
            log.info("Memory alarm stopped while raised; publishers resume")
            self._change(False)

    def check(self) -> bool:
        """Sample RSS now and raise or clear the alarm accordingly.

        Disabled, it still samples (fresh L{rss} and L{peak} for metrics)
        but never raises. When sampling fails the failure is logged once
        (until a sample succeeds again) and the state is kept.

        @return: L{active}.
        """
        rss = self._sample()
        if rss is None or self.high <= 0:
            return self.active
        if self.active:
            if rss < self.low:
                log.info(
                    "Memory alarm cleared: RSS {rss_mib:.0f} MiB is below the low-water mark "
                    "{low_mib:.0f} MiB; publishers resume",
                    **self._marks(rss),
                )
                self._change(False)
        elif rss >= self.high:
            self.raised_count += 1
            log.warn(
                "Memory alarm raised: RSS {rss_mib:.0f} MiB reached the high-water mark "
                "{high_mib:.0f} MiB; publishers are blocked until RSS falls below "
                "{low_mib:.0f} MiB",
                **self._marks(rss),
            )
            self._change(True)
        return self.active

    def describe(self) -> str:
        """What holds publishers back, for a log line or a client's error."""
        return (
            f"memory alarm: the broker uses {self.rss / MiB:.0f} MiB, above its high-water "
            f"mark of {self.high / MiB:.0f} MiB (limits.memory_high_watermark); publishing "
            f"resumes below {self.low / MiB:.0f} MiB"
        )

    def _marks(self, rss: int) -> dict[str, float]:
        """The figures a log line about the alarm carries (bytes and MiB)."""
        return {
            "rss": rss,
            "high": self.high,
            "low": self.low,
            "rss_mib": rss / MiB,
            "high_mib": self.high / MiB,
            "low_mib": self.low / MiB,
        }

    def _sample(self) -> int | None:
        try:
            rss = self._read_rss()
            # Only when this sample would keep or raise the alarm: free
            # memory the allocator still holds is not memory in use.
            if (
                self._trim is not None
                and 0 < self.high
                and rss >= (self.low if self.active else self.high)
            ):
                self._trim()
                rss = self._read_rss()
        except Exception:
            if not self._sample_failed:
                self._sample_failed = True
                log.failure("Memory alarm cannot sample memory use; keeping its state and retrying")
            return None
        self._sample_failed = False
        self.rss = rss
        if rss > self.peak:
            self.peak = rss
        return rss


# -- the disk free-space alarm -------------------------------------------------

DEFAULT_DISK_FREE_LIMIT = "50MB"
"""RabbitMQ's default C{disk_free_limit}: 50 MB (10**6 bytes each) free on
the data directory's filesystem. Small on purpose: it stops the broker
before the disk is full, not before it is nearly full; production sets
more (a fraction, or at least the memory high-water mark)."""

DISK_INTERVAL = 1.0
"""Seconds between two samples of the free space (one C{statvfs}, a few
microseconds). A publisher at 300 MB/s fills 300 MB between two samples:
a limit below that may be crossed before the alarm sees it, and then the
store's own refusal (C{ENOSPC}) is what holds publishers back."""

_DISK_FORMS = (
    "expected a size (bytes as an integer, or a string like '50MB', '1GiB'), a fraction of "
    "the filesystem's size (0 < f < 1, like 0.05, or a string like '5%'), or 0 / 'off' to disable"
)


def parse_disk_limit(value: int | float | str, total: int) -> int:
    """Turn a configured disk free-space limit into bytes; 0 means disabled.

    The forms are those of L{parse_memory_mark} (sizes with units,
    fractions, percentages, 0 or C{"off"}), a fraction referring to the
    size of the filesystem; there is no minimum.

    @param value: the configured value.
    @param total: the size of the filesystem, in bytes; 0 when unknown
        (then a fraction is refused).
    @return: the limit in bytes, or 0 for disabled.
    @raise ValueError: for anything else; the message says what is accepted.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"disk free limit {value!r}: {_DISK_FORMS}")
    text = str(value).strip().lower()
    if text in ("off", "0", "0.0"):
        return 0
    fraction: float | None = None
    if isinstance(value, float):
        fraction = value
    elif m := _PERCENT.fullmatch(text):
        fraction = float(m.group(1)) / 100.0
    elif isinstance(value, int):
        if value < 0:
            raise ValueError(f"disk free limit {value!r} is negative; {_DISK_FORMS}")
        return value
    elif m := _SIZE.fullmatch(text):
        number, unit = m.groups()
        if unit not in _UNITS:
            raise ValueError(f"disk free limit {value!r}: unknown unit {unit!r}; {_DISK_FORMS}")
        if not unit and "." in number:
            fraction = float(number)
        else:
            return int(float(number) * _UNITS[unit])
    else:
        raise ValueError(f"disk free limit {value!r}: {_DISK_FORMS}")
    if not 0.0 < fraction < 1.0:
        if fraction == 0.0:
            return 0
        raise ValueError(
            f"disk free limit {value!r}: a fraction of the filesystem must be > 0 and < 1; "
            f"{_DISK_FORMS}"
        )
    if total <= 0:
        return -1  # resolved once the filesystem's size is known (DiskAlarm)
    return max(1, int(total * fraction))


class DiskAlarm(_Alarm):
    """Raised while the data directory's filesystem has less free space
    than the limit (RabbitMQ's C{disk_free_limit}).

    Sampled every C{interval} seconds on the clock it is given with
    C{statvfs} (injectable): the space available to the broker
    (C{f_bavail}, not counting blocks kept for root). Raised, it holds
    back persistent publishes through L{qmq.core.admission.Admission}
    until the space is back above the limit; consumers go on, and their
    acks let the store delete segments.

    @ivar limit: the limit in bytes (0: disabled; resolved from a fraction
        at the first sample).
    @ivar free: free bytes at the last sample (-1 before the first).
    @ivar total: the filesystem's size at the last sample.
    @ivar raised_count: how many times the alarm has been raised.
    """

    __slots__ = (
        "directory", "spec", "limit", "interval", "free", "total", "raised_count",
        "_clock", "_statvfs", "_loop", "_sample_failed",
    )  # fmt: skip

    def __init__(
        self,
        clock: IReactorTime,
        directory: str,
        limit: int | float | str = DEFAULT_DISK_FREE_LIMIT,
        interval: float = DISK_INTERVAL,
        statvfs: Callable[[str], Any] = os.statvfs,
    ) -> None:
        """
        @param clock: where the sampling loop's time comes from.
        @param directory: the data directory (its filesystem is sampled).
        @param limit: as L{parse_disk_limit} reads it.
        @param interval: seconds between samples while started.
        @param statvfs: returns an C{os.statvfs_result}-like object for a
            path (tests give a fake one).
        @raise ValueError: a malformed limit or interval.
        """
        if interval <= 0:
            raise ValueError(f"disk alarm interval must be positive, not {interval!r}")
        super().__init__()
        self.directory = directory
        self.spec = limit
        self.limit = parse_disk_limit(limit, 0)
        self.interval = interval
        self.free = -1
        self.total = 0
        self.raised_count = 0
        self._clock = clock
        self._statvfs = statvfs
        self._loop: LoopingCall | None = None
        self._sample_failed = False

    @property
    def enabled(self) -> bool:
        """Whether the alarm can be raised at all."""
        return self.limit != 0

    def start(self) -> None:
        """Sample now and every C{interval} seconds (nothing when disabled
        or started already)."""
        if self._loop is not None:
            return
        if not self.enabled:
            log.info("Disk alarm disabled: limits.disk_free_limit is 0")
            return
        loop = self._loop = LoopingCall(self.check)
        loop.clock = self._clock
        loop.start(self.interval, now=True).addErrback(
            lambda failure: log.failure("disk alarm sampling stopped", failure)
        )
        log.info(
            "Disk alarm on: publishing persistent messages stops below {limit_mib:.0f} MiB free "
            "on the filesystem of {directory}, sampled every {interval}s",
            limit_mib=max(self.limit, 0) / MiB,
            limit=self.limit,
            directory=self.directory,
            interval=self.interval,
        )

    def stop(self) -> None:
        """Stop sampling; idempotent. A raised alarm is cleared (nobody
        would clear it later)."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()
        if self.active:
            log.info("Disk alarm stopped while raised; publishers resume")
            self._change(False)

    def describe(self) -> str:
        """What holds publishers back, for a log line or a client's error."""
        return (
            f"disk alarm: {self.free / MiB:.1f} MiB free on the data directory's filesystem, "
            f"below the limit of {self.limit / MiB:.1f} MiB (limits.disk_free_limit); "
            "persistent messages are accepted again once space is freed"
        )

    def check(self) -> bool:
        """Sample the free space now and raise or clear the alarm.

        @return: L{active}.
        """
        try:
            st = self._statvfs(self.directory)
            free = st.f_bavail * st.f_frsize
            total = st.f_blocks * st.f_frsize
        except Exception:
            if not self._sample_failed:
                self._sample_failed = True
                log.failure("Disk alarm cannot read the free space of {directory}; keeping its "
                            "state and retrying", directory=self.directory)
            return self.active
        self._sample_failed = False
        self.free = free
        self.total = total
        if self.limit < 0:
            self.limit = parse_disk_limit(self.spec, total)
        if self.limit <= 0:
            return self.active
        if self.active:
            if free >= self.limit:
                log.info(
                    "Disk alarm cleared: {free_mib:.1f} MiB free on the filesystem of {directory}, "
                    "at or above the limit of {limit_mib:.1f} MiB; persistent publishing resumes",
                    **self._figures(),
                )
                self._change(False)
        elif free < self.limit:
            self.raised_count += 1
            log.warn(
                "Disk alarm raised: {free_mib:.1f} MiB free on the filesystem of {directory}, "
                "below the limit of {limit_mib:.1f} MiB (limits.disk_free_limit); persistent "
                "publishes are held back until space is freed",
                **self._figures(),
            )
            self._change(True)
        return self.active

    def _figures(self) -> dict[str, Any]:
        return {
            "free": self.free,
            "limit": self.limit,
            "directory": self.directory,
            "free_mib": self.free / MiB,
            "limit_mib": self.limit / MiB,
        }
