# -*- test-case-name: tests.test_store_log -*-
"""Segment files: naming, the header, reading records back, appending.

A data directory holds segment files named by their number
(C{00000000000000000042.seg}); a segment holds the header, then records
(L{qmq.store.record}) until it is about C{segment_size} bytes, then the
store starts the next one. Numbers only grow.

Header (32 bytes, little-endian)::

    8 bytes  MAGIC
    u16      format version (record.VERSION)
    u16      flags (0)
    u64      segment number (the file name says it too)
    u64      id floor: every message id published before this segment
             was made is below it (ids never repeat, even once every
             older segment is gone)
    u32      crc32 of the 28 bytes above

L{SegmentReader} walks a segment's records and sorts damage into two kinds
(see docs/storage.rst, "Damage"):

  - a B{torn tail}: the last segment ends inside a record (a crash during a
    write), or its last record fails its checksum, or only zeros follow the
    last good record. The records before it are whole; the store cuts the
    file there (L{truncate}) and appends after the cut.
  - B{corruption}: a record in the middle fails its checksum (skipped: its
    length is still believed, reading goes on after it), or a record
    claims an implausible length or type (reading that segment stops
    there: nothing after it can be found safely). Either is reported with
    the file and the offset; nothing of it is ever delivered.

L{SegmentWriter} is used by the store's writer thread only.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from qmq.store.record import (
    FRAME,
    FRAME_SIZE,
    MAGIC,
    MAX_RECORD,
    RECORD_NAMES,
    TYPE_CRC,
    VERSION,
)

SUFFIX = ".seg"
_HEADER = struct.Struct("<8sHHQQ")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size  # 32


class UnsupportedVersion(Exception):
    """A segment written by a newer QMQ (its header is intact, its version
    unknown): the store refuses to start rather than misread it."""


def segment_name(number: int) -> str:
    """The file name of segment C{number}."""
    return f"{number:020d}{SUFFIX}"


def list_segments(directory: str) -> list[tuple[int, str]]:
    """C{(number, path)} of every segment file in C{directory}, in order."""
    found = []
    for name in os.listdir(directory):
        if name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit():
            found.append((int(name[: -len(SUFFIX)]), os.path.join(directory, name)))
    found.sort()
    return found


def encode_header(number: int, id_floor: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, 0, number, id_floor)
    return head + _HEADER_CRC.pack(zlib.crc32(head))


@dataclass
class Header:
    """A segment header as read back."""

    version: int
    number: int
    id_floor: int
    crc_ok: bool


def decode_header(data: bytes) -> Header | None:
    """The header at the start of C{data}, or None if C{data} does not start
    with one (too short, or not our magic).

    @raise UnsupportedVersion: an intact header of a newer format.
    """
    if len(data) < HEADER_SIZE or data[:8] != MAGIC:
        return None
    magic, version, _flags, number, floor = _HEADER.unpack_from(data, 0)
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    crc_ok = crc == zlib.crc32(data[: _HEADER.size])
    if crc_ok and version > VERSION:
        raise UnsupportedVersion(
            f"segment format version {version}, this QMQ reads up to {VERSION}"
        )
    return Header(version, number, floor, crc_ok)


@dataclass
class Problem:
    """Damage found in a segment.

    @ivar kind: C{"torn"} (a torn tail), C{"corrupt"} (a damaged record,
        skipped), C{"unreadable"} (reading the segment stopped here),
        C{"header"} (the header is damaged or missing).
    """

    path: str
    offset: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path} at offset {self.offset}: {self.kind}: {self.detail}"


@dataclass
class SegmentReader:
    """Reads one segment's records from its bytes.

    Iterate L{records} for C{(type, payload start, payload end)}; damage is
    collected in L{problems}; after the walk, L{cut} is the offset of a
    torn tail (only if C{last}) and L{clean} says whether appending after
    L{end} is safe.

    @ivar data: the whole file.
    @ivar last: whether this is the newest segment (the only one that may
        have a torn tail).
    """

    path: str
    data: bytes
    last: bool = False
    problems: list[Problem] = field(default_factory=list)
    header: Header | None = None
    cut: int | None = None
    end: int = 0
    clean: bool = True

    def records(self, start: int | None = None) -> Iterator[tuple[int, int, int]]:
        """C{(type, payload start, payload end)} of each whole record.

        @param start: the offset of a record to begin at (one this reader,
            or another over the same bytes, yielded before): the header is
            then not read again.
        """
        data = self.data
        size = len(data)
        path = self.path
        if start is not None:
            yield from self._walk(start, size)
            return
        try:
            self.header = decode_header(data)
        except UnsupportedVersion as e:
            raise UnsupportedVersion(f"{path}: {e}") from None
        if self.header is None:
            if self.last and (size < HEADER_SIZE and MAGIC.startswith(data[:8])):
                # Made but not yet written when the broker stopped.
                self.problems.append(Problem(path, 0, "torn", f"header cut short ({size} bytes)"))
                self.cut = 0
                self.end = 0
                return
            self.problems.append(
                Problem(path, 0, "header", "not a segment header; records read anyway")
            )
            self.clean = False
        elif not self.header.crc_ok:
            self.problems.append(Problem(path, 0, "header", "header checksum mismatch"))
        yield from self._walk(HEADER_SIZE, size)

    def _walk(self, pos: int, size: int) -> Iterator[tuple[int, int, int]]:
        data = self.data
        path = self.path
        unpack = FRAME.unpack_from
        crc32 = zlib.crc32
        view = memoryview(data)
        names = RECORD_NAMES
        type_crc = TYPE_CRC
        while pos < size:
            if size - pos < FRAME_SIZE:
                self._tail(pos, f"{size - pos} bytes, shorter than a record frame")
                return
            length, type_, crc = unpack(data, pos)
            start = pos + FRAME_SIZE
            end = start + length
            if end > size:
                if length <= MAX_RECORD and type_ in names:
                    self._tail(pos, f"{names[type_]} record of {length} bytes cut short at {size}")
                else:
                    self._unreadable(pos, length, type_)
                return
            if type_ not in names:
                if crc32(view[start:end], type_crc[type_]) == crc:
                    # A record of a newer kind, intact: this version ignores it.
                    self.problems.append(
                        Problem(path, pos, "corrupt", f"unknown record type {type_}, skipped")
                    )
                    pos = end
                    continue
                self._unreadable(pos, length, type_)
                return
            if crc32(view[start:end], type_crc[type_]) != crc:
                if end == size and self.last:
                    self._tail(pos, f"{names[type_]} record with a bad checksum at the end")
                    return
                self.problems.append(
                    Problem(
                        path,
                        pos,
                        "corrupt",
                        f"{names[type_]} record of {length} bytes: bad checksum, skipped",
                    )
                )
                pos = end
                continue
            yield type_, start, end
            pos = end
        self.end = pos

    def _tail(self, pos: int, detail: str) -> None:
        self.end = pos
        if self.last:
            self.problems.append(Problem(self.path, pos, "torn", detail))
            self.cut = pos
        else:
            # A crash cannot tear a segment that has a successor: damage.
            self.problems.append(Problem(self.path, pos, "unreadable", detail))
            self.clean = False

    def _unreadable(self, pos: int, length: int, type_: int) -> None:
        rest = self.data[pos:]
        if self.last and not rest.strip(b"\0"):
            # Zeros after the last record: space the file system gave the
            # file but the write never filled (a crash). A torn tail.
            self._tail(pos, f"{len(rest)} zero bytes after the last record")
            return
        self.end = pos
        self.clean = False
        self.problems.append(
            Problem(
                self.path,
                pos,
                "unreadable",
                f"implausible record (type {type_}, length {length}); "
                f"the {len(rest)} bytes from here on are not read",
            )
        )


def read_segment(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def truncate(path: str, offset: int) -> None:
    """Cut C{path} at C{offset} and make the cut durable."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: str) -> None:
    """Make a file's creation or removal in C{directory} durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """Appends to segment files (in the writer thread only).

    @ivar number: the segment open for appending, or None.
    """

    def __init__(self, directory: str, datasync=os.fdatasync) -> None:
        self.directory = directory
        self.datasync = datasync
        self.number: int | None = None
        self.fd: int | None = None
        self.dirty = False

    def open(self, number: int, create_header: bytes | None) -> None:
        """Make C{number} the segment appended to: open it for appending, or
        create it with C{create_header} (then the directory is synced)."""
        self.close()
        path = os.path.join(self.directory, segment_name(number))
        if create_header is None:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            self._write(create_header)
            # The header is synced with the first batch; the directory now,
            # so the file is found after a crash.
            self.dirty = True
            sync_directory(self.directory)
        self.number = number

    def write(self, data: bytes) -> None:
        self._write(data)
        self.dirty = True

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        fd = self.fd
        while view:
            n = os.write(fd, view)  # type: ignore[arg-type]
            view = view[n:]

    def sync(self) -> None:
        if self.fd is not None and self.dirty:
            self.datasync(self.fd)
            self.dirty = False

    def close(self) -> None:
        """Sync and close the open segment (if any)."""
        if self.fd is not None:
            try:
                self.sync()
            finally:
                os.close(self.fd)
                self.fd = None
                self.number = None

    def abandon(self) -> None:
        """Close the open segment without syncing it (a write to it failed:
        what it holds past the last good write is cut before writing again)."""
        fd, self.fd = self.fd, None
        self.number = None
        self.dirty = False
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass  # the descriptor is gone either way

    def remove(self, number: int) -> None:
        """Delete segment C{number}."""
        if number == self.number:
            self.close()  # never write on into a file already unlinked
        try:
            os.unlink(os.path.join(self.directory, segment_name(number)))
        except FileNotFoundError:
            pass
