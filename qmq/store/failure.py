# -*- test-case-name: tests.test_store_full,tests.test_store_log -*-
"""What the commit log does when a write fails, until it writes again.

A full disk or an I/O error makes the writer thread's write (or its
fdatasync) fail. The flow, all of it on the reactor thread and none of it
on the publish path while the disk takes data:

  1. L{WriteFailure._write_failed} gets the batch back: nothing of it was
     confirmed, so every Deferred waiting on it fails with L{StoreFailed}
     (RECEIPTs become errors, the HTTP API answers 503), and its records are
     kept (L{WriteFailure._keep}). The first failure is logged once, then
     every 30 seconds, and the store's watchers (L{WriteFailure.watch};
     admission holds persistent publishers back) are told.
  2. While the store cannot write, every batch submitted joins the kept
     records instead of being written, and every publish is refused
     whatever its fsync policy (the store's C{failure} says why).
  3. Every C{retry_interval} seconds L{WriteFailure._retry} takes the kept
     records, cuts each segment they write back to its last good write (a
     failed write may leave part of a record; a failed sync, pages the
     kernel dropped), writes them again and syncs. When that succeeds
     (L{WriteFailure._rewritten}) the store writes again, says so in the
     log and to its watchers, and the batch completes as any other.

L{WriteFailure} is a part of L{qmq.store.log.CommitLogStore} (a base class
of it, with no state of its own): it reads and sets the store's
attributes, which C{CommitLogStore.__init__} makes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.store.segment import segment_name

if TYPE_CHECKING:
    from qmq.store.log import _Batch

_log = Logger()


class StoreFailed(Exception):
    """The store could not write: what it was asked to keep may be lost."""


class WriteFailure:
    """The commit log's failed writes and its retries (see the module
    docstring); a base class of L{qmq.store.log.CommitLogStore}."""

    # Made by CommitLogStore.__init__.
    _failed: StoreFailed | None
    _watchers: list[Callable[[bool, str], object]]

    def watch(self, callback: Callable[[bool, str], object]) -> None:
        """Call C{callback(False, detail)} when a write fails and
        C{callback(True, "")} once the store writes again
        (L{qmq.core.store.MessageStore.watch})."""
        self._watchers.append(callback)

    @property
    def failure(self) -> str | None:
        """Why the store cannot write now, or None while it can."""
        return str(self._failed) if self._failed is not None else None

    def _tell(self, healthy: bool, detail: str) -> None:
        for callback in list(self._watchers):
            try:
                callback(healthy, detail)
            except Exception:
                _log.failure("commit log: store watcher {callback!r} failed", callback=callback)

    def _write_failed(self, failure: Any, batch: _Batch) -> None:
        """A batch could not be written (or synced): refuse what waits for
        it, keep its records, and try again every C{retry_interval}.

        Nothing of it was confirmed: its publishes' Deferreds fail (their
        RECEIPTs are errors, HTTP answers 503). Its records, and those
        made until the store writes again, are kept and written by the
        retry, after the segments are cut back to their last good write.
        Until then every publish is refused whatever its fsync policy, and
        the store's watchers (admission) hold persistent publishers back.
        """
        self._inflight = None
        error = failure.value
        if isinstance(error, OSError) and error.errno is not None:
            why = f"{os.strerror(error.errno)} ({errno.errorcode.get(error.errno, error.errno)})"
        else:
            why = failure.getErrorMessage()
        first = self._failed is None
        # No path: the reason reaches clients (a STOMP ERROR, the health answer).
        self._failed = StoreFailed(f"the commit log cannot write: {why}")
        self._keep(batch)
        now = self._reactor.seconds()
        if first:
            self.failures += 1
            self._failed_at = self._retry_logged = now
            _log.error(
                "commit log: a write to {directory} failed ({why}); persistent publishes are "
                "refused, and the store retries every {interval:g} s until it can write again",
                why=why,
                interval=self.retry_interval,
                directory=self.directory,
            )
            self._tell(False, str(self._failed))
        elif now - self._retry_logged >= 30:
            self._retry_logged = now
            _log.warn(
                "commit log: still cannot write after {seconds:.0f} s ({why}); retrying every "
                "{interval:g} s",
                seconds=now - self._failed_at,
                why=why,
                interval=self.retry_interval,
            )
        if self._retry_call is None and not self._closing:
            self._retry_call = self._reactor.callLater(self.retry_interval, self._retry)
        if self._batch:
            self._submit()

    def _keep(self, batch: _Batch) -> None:
        """While the store cannot write: fail C{batch}'s waiters and keep
        its records, after those kept before, for the retry."""
        self._fail_batch(batch, self._failed)  # type: ignore[arg-type]
        batch.waiters = []
        batch.done = None
        kept = self._retry_batch
        if kept is None:
            self._retry_batch = batch
            return
        kept.parts.extend(batch.parts)
        kept.deletes.extend(batch.deletes)
        kept.ends.update(batch.ends)
        kept.sync = kept.sync or batch.sync
        kept.interval = kept.interval or batch.interval
        kept.other = kept.other or batch.other
        if batch.offloads:
            if kept.offloads is None:
                kept.offloads = {}
            for queue, pairs in batch.offloads.items():
                kept.offloads.setdefault(queue, []).extend(pairs)

    def _retry(self) -> None:
        """Try to write the kept records again (timer)."""
        self._retry_call = None
        if self._failed is None or self._inflight is not None:
            return
        self._submit()  # what gathered since joins the kept records
        batch, self._retry_batch = self._retry_batch, None
        if batch is None:  # pragma: no cover - a failure always keeps its batch
            from qmq.store.log import _Batch  # noqa: PLC0415 - log.py imports this module

            batch = _Batch()
        batch.sync = True  # the retry proves the disk takes data again
        # Each segment the batch writes is cut back to what was last
        # written whole (or made anew): a failed write may leave part of a
        # record, and a failed sync leaves pages the kernel may have dropped.
        plan: list[tuple[int, int | None]] = []
        seen: set[int] = set()
        for number, header, _chunks in batch.parts:
            if number not in seen:
                seen.add(number)
                plan.append((number, None if header is not None else self._sizes.get(number)))
        self._inflight = batch
        self._run(self._rewrite, batch, plan).addCallbacks(
            self._rewritten, self._write_failed, callbackArgs=(batch,), errbackArgs=(batch,)
        )

    def _rewrite(self, batch: _Batch, plan: list[tuple[int, int | None]]) -> None:
        """In the writer thread: cut the segments back, then write C{batch}."""
        writer = self._writer
        writer.abandon()
        for number, size in plan:
            path = os.path.join(self.directory, segment_name(number))
            if size is None:
                try:
                    os.unlink(path)  # made by the failed write: made again
                except FileNotFoundError:
                    pass
            else:
                os.truncate(path, size)
        self._write_batch(batch)

    def _rewritten(self, _: None, batch: _Batch) -> None:
        seconds = self._reactor.seconds() - self._failed_at
        self._failed = None
        self.recoveries += 1
        _log.info(
            "commit log: writing again after {seconds:.1f} s: the records kept since the failed "
            "write are written and synced; persistent publishes are accepted again",
            seconds=seconds,
            directory=self.directory,
        )
        self._tell(True, "")
        self._written(None, batch)

    def _fail_batch(self, batch: _Batch, error: Exception) -> None:
        for d in batch.waiters:
            if d is batch.done:
                # Shared: each caller's errback passes the failure on; it
                # ends here (logged once, by _write_failed).
                d.addErrback(lambda f: None)
            d.errback(error)
