# -*- test-case-name: tests.test_store_tool -*-
"""C{qmq-store}: look into a commit-log data directory without a broker.

    qmq-store DIR list      segments: number, size, records, id floor, damage
    qmq-store DIR count     live messages per virtual host and queue
    qmq-store DIR verify    every checksum; exit status 1 if anything is damaged
    qmq-store DIR dump      every record, one line each (--bodies: with bodies)

(also C{python -m qmq.store.tool}). The tool only reads: it never cuts a
torn tail nor deletes a segment, so it is safe on a directory a broker is
using (it then sees the log as of the moment each file was read).
It reads segments with the broker's own reader and replays them with the
broker's own L{qmq.store.replay.Replay}, so what C{count} prints is what a
start would recover.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from qmq.store.index import Index
from qmq.store.record import (
    FRAME_SIZE,
    RECORD_NAMES,
    RECORD_PUBLISH,
    RECORD_REQUEUE,
    RECORD_SETTLE,
    TOPOLOGY_RECORDS,
    RecordError,
    decode_publish,
    decode_requeue,
    decode_settle,
    decode_topology,
)
from qmq.store.replay import Replay
from qmq.store.segment import (
    SegmentReader,
    UnsupportedVersion,
    list_segments,
    read_segment,
)


def _readers(directory: str):
    """C{(number, path, data, reader)} of every segment, in order."""
    segments = list_segments(directory)
    for i, (number, path) in enumerate(segments):
        data = read_segment(path)
        yield number, path, data, SegmentReader(path, data, last=i == len(segments) - 1)


def cmd_list(directory: str, out: TextIO, args: argparse.Namespace) -> int:
    out.write(f"{'segment':>20} {'bytes':>12} {'records':>9} {'id floor':>12}  problems\n")
    total = 0
    for number, _path, data, reader in _readers(directory):
        count = sum(1 for _ in reader.records())
        floor = reader.header.id_floor if reader.header is not None else "-"
        problems = "; ".join(f"{p.kind} at {p.offset}" for p in reader.problems) or "-"
        out.write(f"{number:>20} {len(data):>12} {count:>9} {floor:>12}  {problems}\n")
        total += len(data)
    out.write(f"{'total':>20} {total:>12}\n")
    return 0


def cmd_count(directory: str, out: TextIO, args: argparse.Namespace) -> int:
    index = Index()
    replay = Replay(index, bodies=False)
    damaged = 0
    for number, _path, data, reader in _readers(directory):
        index.add_segment(number)
        replay.segment(number, data, reader)
        damaged += len(reader.problems)
    out.write(f"{'vhost':<16} {'queue':<32} {'messages':>10} {'redelivered':>11}\n")
    total = 0
    for vhost, queues in sorted(index.vhosts.items()):
        for name, qs in sorted(queues.items()):
            if qs.declared is None and not len(qs):
                continue
            redelivered = sum(1 for _, c in qs.items() if c)
            out.write(f"{vhost:<16} {name:<32} {len(qs):>10} {redelivered:>11}\n")
            total += len(qs)
    out.write(
        f"{len(index.where)} live messages ({total} queue entries), next message id "
        f"{index.max_id + 1}, {len(index.exchanges)} exchanges, {len(index.bindings)} bindings, "
        f"{len(index.exchange_bindings)} exchange-to-exchange bindings"
        + (f", {damaged} problems (see verify)" if damaged else "")
        + "\n"
    )
    return 0


def cmd_verify(directory: str, out: TextIO, args: argparse.Namespace) -> int:
    bad = 0
    segments = records = 0
    for _number, _path, data, reader in _readers(directory):
        segments += 1
        for type_, start, end in reader.records():
            records += 1
            try:
                _decode(type_, data, start, end)
            except (RecordError, KeyError, TypeError) as e:
                out.write(f"{reader.path} at offset {start - FRAME_SIZE}: corrupt: {e}\n")
                bad += 1
        for problem in reader.problems:
            out.write(f"{problem}\n")
            bad += 1
    out.write(f"{segments} segments, {records} records, {bad} problems\n")
    return 1 if bad else 0


def _decode(type_: int, data: bytes, start: int, end: int) -> str:
    """One record as text (what C{dump} prints)."""
    if type_ == RECORD_PUBLISH:
        p = decode_publish(data, start, end)
        text = (
            f"id={p.id} vhost={p.vhost!r} queues={p.queues!r} exchange={p.exchange!r} "
            f"routing_key={p.routing_key!r} timestamp={p.timestamp:.6f} bytes={len(p.body)}"
        )
        if p.priority:
            text += f" priority={p.priority}"
        if p.expiry:
            text += f" expiry={p.expiry:.3f}"
        if p.deliver_at:
            text += f" deliver_at={p.deliver_at:.3f}"
        if p.ack_timeout:
            text += f" ack_timeout={p.ack_timeout:g}"
        if p.properties:
            text += f" properties={json.dumps(p.properties, sort_keys=True)}"
        if p.headers:
            text += f" headers={json.dumps(p.headers, sort_keys=True, default=repr)}"
        return text
    if type_ == RECORD_SETTLE:
        vhost, queue, mid, reason, kept = decode_settle(data, start, end)
        text = f"id={mid} vhost={vhost!r} queue={queue!r} reason={reason}"
        return text + f" kept_until={kept:.3f}" if kept else text
    if type_ == RECORD_REQUEUE:
        vhost, queue, mid, count = decode_requeue(data, start, end)
        return f"id={mid} vhost={vhost!r} queue={queue!r} delivery_count={count}"
    if type_ in TOPOLOGY_RECORDS:
        fields = decode_topology(data, start, end, type_)
        return json.dumps(fields, sort_keys=True, default=str)
    return f"{end - start} bytes"


def cmd_dump(directory: str, out: TextIO, args: argparse.Namespace) -> int:
    for number, _path, data, reader in _readers(directory):
        out.write(f"# segment {number}\n")
        for type_, start, end in reader.records():
            offset = start - FRAME_SIZE
            name = RECORD_NAMES.get(type_, f"type-{type_}")
            try:
                text = _decode(type_, data, start, end)
            except (RecordError, KeyError, TypeError) as e:
                text = f"undecodable: {e}"
            out.write(f"{number}:{offset} {name} {text}\n")
            if args.bodies and type_ == RECORD_PUBLISH:
                try:
                    body = decode_publish(data, start, end).body
                except RecordError:
                    continue
                out.write(f"    body: {body!r}\n")
        for problem in reader.problems:
            out.write(f"# {problem}\n")
    return 0


COMMANDS = {"list": cmd_list, "count": cmd_count, "verify": cmd_verify, "dump": cmd_dump}


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the tool; return the exit status (0 fine, 1 damage found by
    C{verify}, 2 a usage error or an unreadable directory)."""
    out = out if out is not None else sys.stdout
    parser = argparse.ArgumentParser(
        prog="qmq-store", description="Look into a QMQ commit-log data directory (read only)."
    )
    parser.add_argument("directory", help="the data directory (the broker's data_dir)")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to do")
    parser.add_argument("--bodies", action="store_true", help="dump: print message bodies too")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        sys.stderr.write(f"qmq-store: {args.directory}: not a directory\n")
        return 2
    try:
        return COMMANDS[args.command](args.directory, out, args)
    except UnsupportedVersion as e:
        sys.stderr.write(f"qmq-store: {e}\n")
        return 2
    except BrokenPipeError:
        return 0


def main_exit() -> None:
    """The C{qmq-store} console script."""
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
