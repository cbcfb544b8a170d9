"""Worker bodies of the load generator: producers, consumers, idle holders.

Each function runs in a worker process (see :mod:`workers`). Each one:
connects, reports ``ready``, waits for ``go``, does its bounded work (a
message count AND a deadline), reports ``done`` with its counters, its own
CPU seconds and timestamps, then waits for ``stop`` before closing sockets.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

from procstat import self_cpu
from profiles import Profile
from stompwire import (
    ACK_ID_RE,
    ERROR_MARK,
    MSG_ID_RE,
    NUL,
    StompError,
    StompProtocol,
    error_text,
    open_connection,
    send_frame,
    subscribe_frame,
    sync_connect,
)
from workers import Control, SyncControl


@dataclass(frozen=True)
class Target:
    """Where the broker is and how to talk to it."""

    host: str
    port: int
    profile: Profile
    tls: bool = False
    #: STOMP over a WebSocket at this path (port: the broker's HTTP port).
    ws_path: str | None = None
    #: STOMP frames per WebSocket message the clients send (1: as browsers do).
    ws_batch: int = 1


@dataclass(frozen=True)
class Limits:
    """Time bounds shared by all workers of a scenario."""

    #: Cap on the measured phase; the counts are cut short past it.
    max_seconds: float = 30.0
    #: Connect / subscribe / parent handshake timeout.
    setup: float = 20.0
    #: No progress for this long in the measured phase is an error.
    stall: float = 10.0


async def _subscribe(
    t: Target, dest: str, sub_id: str, ack: str, prefetch: int | None, lim: Limits
) -> StompProtocol:
    proto, _ = await open_connection(
        t.host, t.port, t.profile, t.tls, timeout=lim.setup, ws_path=t.ws_path, ws_batch=t.ws_batch
    )
    await proto.request(
        subscribe_frame(t.profile, dest, sub_id, ack, prefetch, receipt=f"sub-{sub_id}"),
        "RECEIPT",
        lim.setup,
    )
    return proto


class Progress:
    """Consumer progress shared with the producer (a slot of a shared array).

    The producer keeps at most ``max_lead`` messages ahead of the slowest
    subscriber, so that the measured rate is a sustained one rather than the
    rate of draining a backlog that the broker had to buffer.
    """

    def __init__(self, shared: Any, slot: int, counters: list[Any]) -> None:
        self.shared = shared
        self.slot = slot
        self.counters = counters

    def update(self) -> None:
        """Publish the smallest count of this worker's subscribers."""
        self.shared[self.slot] = min(c.n for c in self.counters)


class _Count:
    """Per-connection counters of a consumer."""

    __slots__ = ("n", "t_first", "t_last", "target", "done", "progress")

    def __init__(self, target: int, progress: Progress | None = None) -> None:
        self.progress = progress
        self.n = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.target = target
        self.done = False


def _counting_handler(proto: StompProtocol, c: _Count, all_done: asyncio.Event, left: list[int]):
    """Return a data handler that counts frames by their NUL terminators."""
    tail = b""
    mono = time.monotonic

    def on_data(data: bytes) -> None:
        nonlocal tail
        if ERROR_MARK in data or ERROR_MARK in tail + data[:6]:
            proto.fail(error_text(tail + data))
            all_done.set()
            return
        tail = data[-6:]
        c.n += data.count(NUL)
        if c.progress is not None:
            c.progress.update()
        now = mono()
        if not c.t_first:
            c.t_first = now
        c.t_last = now
        if not c.done and c.n >= c.target:
            c.done = True
            left[0] -= 1
            if left[0] <= 0:
                all_done.set()

    return on_data


def _acking_handler(
    proto: StompProtocol, c: _Count, all_done: asyncio.Event, left: list[int], version: str, sub_id: str
):
    """Return a data handler that ACKs every message of each buffer in one write."""
    pending = b""
    mono = time.monotonic
    sub = sub_id.encode()

    def on_data(data: bytes) -> None:
        nonlocal pending
        buf = pending + data if pending else data
        i = buf.rfind(NUL)
        if i < 0:
            pending = buf
            return
        complete, pending = buf[: i + 1], buf[i + 1 :]
        if ERROR_MARK in complete:
            proto.fail(error_text(complete))
            all_done.set()
            return
        if version == "1.2":
            ids = ACK_ID_RE.findall(complete)
            proto.write(b"".join([b"ACK\nid:" + x + b"\n\n\0" for x in ids]))
        else:
            ids = MSG_ID_RE.findall(complete)
            proto.write(
                b"".join(
                    [b"ACK\nsubscription:" + sub + b"\nmessage-id:" + x + b"\n\n\0" for x in ids]
                )
            )
        c.n += len(ids)
        if c.progress is not None:
            c.progress.update()
        now = mono()
        if not c.t_first:
            c.t_first = now
        c.t_last = now
        if not c.done and c.n >= c.target:
            c.done = True
            left[0] -= 1
            if left[0] <= 0:
                all_done.set()

    return on_data


async def _watch(
    protos: list[StompProtocol],
    counters: list[Any],
    all_done: asyncio.Event,
    deadline: float,
    stall: float,
) -> tuple[bool, str | None]:
    """Wait until done, deadline (truncated=True), failure or stall (reason)."""
    last_total = -1
    last_change = time.monotonic()
    while True:
        try:
            await asyncio.wait_for(all_done.wait(), 0.2)
        except TimeoutError:
            pass
        for p in protos:
            if p.failure:
                return False, p.failure
        if all_done.is_set():
            return False, None
        now = time.monotonic()
        if now >= deadline:
            return True, None
        total = sum(c.n for c in counters)
        if total != last_total:
            last_total, last_change = total, now
        elif now - last_change > stall:
            return False, f"stalled: no progress for {stall:.0f}s at {total} frames"


async def consume(
    ctl: Control,
    t: Target,
    dests: list[str],
    expect_each: int,
    ack: str,
    prefetch: int | None,
    stalled: int,
    lim: Limits,
    shared: Any = None,
    slot: int = 0,
    late: bool = False,
) -> None:
    """Subscribe one connection per destination and count (or ACK) messages.

    ``stalled`` extra connections subscribe to ``dests[0]`` and stop reading.
    ``shared[slot]`` (if given) receives the progress of the slowest subscriber.
    ``late``: connect before ``go`` but SUBSCRIBE (without a receipt) only
    after it, for queues that already hold messages.
    """
    protos: list[StompProtocol] = []
    counters: list[_Count] = []
    progress = Progress(shared, slot, counters) if shared is not None else None
    all_done = asyncio.Event()
    left = [len(dests)]
    for i, d in enumerate(dests):
        sub_id = str(i)
        if late:
            proto, _ = await open_connection(t.host, t.port, t.profile, t.tls, timeout=lim.setup)
        else:
            proto = await _subscribe(t, d, sub_id, ack, prefetch, lim)
        c = _Count(expect_each, progress)
        if proto.buf.strip(b"\r\n"):
            raise StompError("unexpected frames right after SUBSCRIBE")
        if ack == "auto":
            proto.on_data = _counting_handler(proto, c, all_done, left)
        else:
            proto.on_data = _acking_handler(proto, c, all_done, left, t.profile.version, sub_id)
        protos.append(proto)
        counters.append(c)
    frozen = []
    for j in range(stalled):
        proto = await _subscribe(t, dests[0], f"stalled-{j}", "auto", None, lim)
        assert proto.transport is not None
        proto.transport.pause_reading()
        frozen.append(proto)
    ctl.send("ready", {"connections": len(protos) + len(frozen)})
    t0 = await ctl.wait("go", lim.setup * 3)
    cpu0 = self_cpu()
    if late:
        for i, (proto, d) in enumerate(zip(protos, dests, strict=True)):
            proto.write(subscribe_frame(t.profile, d, str(i), ack, prefetch))
    truncated, failure = await _watch(protos, counters, all_done, t0 + lim.max_seconds, lim.stall)
    cpu = self_cpu() - cpu0
    if failure:
        raise StompError(failure)
    ctl.send(
        "done",
        {
            "received": [c.n for c in counters],
            "t_first": min((c.t_first for c in counters if c.t_first), default=0.0),
            "t_last": max(c.t_last for c in counters),
            "truncated": truncated,
            "cpu": cpu,
        },
    )
    await _linger(ctl, protos + frozen)


async def _linger(ctl: Control, protos: list[StompProtocol]) -> None:
    """Keep connections open until the parent says stop, then close them."""
    try:
        await ctl.wait("stop", 60)
    except StompError:
        pass
    for p in protos:
        p.close()
    await asyncio.sleep(0)


def _body(size: int) -> bytes:
    """Return a printable body of ``size`` bytes (no NUL, no newline)."""
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return (pattern * (size // len(pattern) + 1))[:size]


async def produce(
    ctl: Control,
    t: Target,
    dest: str,
    n: int,
    body_size: int,
    receipt_window: int | None,
    lim: Limits,
    block_ok: bool = False,
    shared: Any = None,
    max_lead: int = 0,
    extra: bytes = b"",
) -> None:
    """Send ``n`` SEND frames to ``dest`` (``{i}`` in it makes one per frame).

    ``receipt_window`` None streams frames with TCP flow control only, unless
    the profile caps unreceipted frames (coilmq): then each batch of up to
    half the cap (in frames and bytes) ends with a receipt, and two batches
    are in flight. An integer puts a receipt on every frame and keeps that
    many outstanding (at most the cap). ``block_ok``: being blocked by the broker's flow control until
    the deadline is a result (``blocked``), not an error. With ``shared``
    (consumer progress) and ``max_lead`` > 0, never run more than
    ``max_lead`` messages ahead of the slowest consumer. ``extra``: header
    lines added to every SEND (``b"\\npersistent:true"``).
    """
    p = t.profile
    proto, _ = await open_connection(
        t.host, t.port, p, t.tls, timeout=lim.setup, ws_path=t.ws_path, ws_batch=t.ws_batch
    )
    assert proto.transport is not None
    proto.transport.set_write_buffer_limits(high=1 << 20)
    body = _body(body_size)
    per_frame_dest = "{i}" in dest
    lead = _Lead(shared, max_lead) if shared is not None and max_lead > 0 else None
    ctl.send("ready", {"connections": 1})
    t0 = await ctl.wait("go", lim.setup * 3)
    cpu0 = self_cpu()
    deadline = t0 + lim.max_seconds
    if receipt_window is None and p.max_unreceipted is None and not per_frame_dest:
        f = send_frame(dest, body)
        if extra:
            f = f.replace(b"\n", extra + b"\n", 1)
        res = await _stream(proto, f, n, deadline, lim, block_ok, lead)
    else:
        if receipt_window is None:
            assert p.max_unreceipted is not None
            flen = len(send_frame(dest, body)) + 16
            # Two half-size batches in flight: the pipe never empties, and the
            # bytes in flight stay within the cap.
            cap = min(p.max_unreceipted, (p.max_batch_bytes or 1 << 30) // flen)
            per_batch = max(1, cap // 2)
            window = 2 if cap >= 2 else 1
        else:
            per_batch = 1
            window = min(receipt_window, p.max_unreceipted or receipt_window)
        res = await _windowed(proto, dest, body, n, per_batch, window, deadline, lim, lead, extra)
    res["cpu"] = self_cpu() - cpu0
    ctl.send("done", res)
    await _linger(ctl, [proto])


async def produce_many(
    ctl: Control,
    t: Target,
    dests: list[str],
    n_each: int,
    body_size: int,
    receipt_window: int,
    lim: Limits,
    extra: bytes = b"",
) -> None:
    """One connection per destination in this process, each sending
    ``n_each`` SENDs with a receipt on every frame, ``receipt_window``
    outstanding per connection (several producers without a process each:
    the load generator shares the machine with the broker).

    ``done`` carries the sums (``receipts``, ``sent``), the last receipt's
    time and ``per_conn`` receipts.
    """
    p = t.profile
    protos = []
    for _ in dests:
        proto, _ = await open_connection(t.host, t.port, p, t.tls, timeout=lim.setup)
        assert proto.transport is not None
        proto.transport.set_write_buffer_limits(high=1 << 20)
        protos.append(proto)
    body = _body(body_size)
    window = min(receipt_window, p.max_unreceipted or receipt_window)
    ctl.send("ready", {"connections": len(protos)})
    t0 = await ctl.wait("go", lim.setup * 3)
    cpu0 = self_cpu()
    deadline = t0 + lim.max_seconds
    results = await asyncio.gather(
        *[
            _windowed(pr, d, body, n_each, 1, window, deadline, lim, None, extra)
            for pr, d in zip(protos, dests, strict=True)
        ]
    )
    ctl.send(
        "done",
        {
            "receipts": sum(r["receipts"] for r in results),
            "sent": sum(r["sent"] for r in results),
            "per_conn": [r["receipts"] for r in results],
            "t_last": max(r["t_last"] for r in results),
            "truncated": any(r["truncated"] for r in results),
            "window": window,
            "cpu": self_cpu() - cpu0,
        },
    )
    await _linger(ctl, protos)


class _Lead:
    """Producer side of :class:`Progress`: how far ahead of the consumers we are."""

    def __init__(self, shared: Any, max_lead: int) -> None:
        self.shared = shared
        self.max_lead = max_lead
        self.waits = 0

    def room(self, sent: int) -> int:
        """Return how many more messages may be sent now."""
        return self.max_lead - (sent - min(self.shared))

    async def wait(self, sent: int, want: int, deadline: float, stall: float) -> None:
        """Sleep until ``want`` more messages fit (bounded by deadline and stall)."""
        t0 = time.monotonic()
        while self.room(sent) < want:
            now = time.monotonic()
            if now >= deadline:
                return
            if now - t0 > stall:
                raise StompError(f"consumers made no progress for {stall:.0f}s at {sent} sent")
            self.waits += 1
            await asyncio.sleep(0.002)


async def _stream(
    proto: StompProtocol,
    f: bytes,
    n: int,
    deadline: float,
    lim: Limits,
    block_ok: bool = False,
    lead: _Lead | None = None,
) -> dict[str, Any]:
    """Write ``n`` copies of frame ``f`` in 64 KiB chunks, honouring back-pressure."""
    proto.on_data = lambda data: proto.fail(error_text(data)) if ERROR_MARK in data else None
    k = max(1, 65536 // len(f))
    chunk = f * k
    sent = 0
    truncated = blocked = False
    blocked_s = 0.0
    spins = 0
    while sent < n:
        if proto.failure:
            raise StompError(proto.failure)
        if time.monotonic() >= deadline:
            truncated = True
            break
        m = min(k, n - sent)
        if lead is not None:
            await lead.wait(sent, min(m, lead.max_lead), deadline, lim.stall)
            if time.monotonic() >= deadline:
                truncated = True
                break
        proto.write(chunk if m == k else f * m)
        sent += m
        spins += 1
        if not proto._can_write.is_set():
            wait = max(0.0, deadline - time.monotonic()) if block_ok else lim.stall
            w0 = time.monotonic()
            try:
                await asyncio.wait_for(proto.drain(), wait)
            except TimeoutError as e:
                if block_ok:
                    # Held by flow control until the deadline (> 1 s: not mere back-pressure).
                    blocked = time.monotonic() - w0 >= 1.0
                    truncated = True
                    break
                raise StompError(f"producer blocked for {lim.stall:.0f}s at {sent} frames") from e
            finally:
                blocked_s = max(blocked_s, time.monotonic() - w0)
        elif spins % 16 == 0:
            await asyncio.sleep(0)
    return {
        "sent": sent,
        "receipts": 0,
        "t_last": time.monotonic(),
        "truncated": truncated,
        "blocked": blocked,
        "longest_block_s": round(blocked_s, 3),
        "lead_waits": lead.waits if lead else 0,
    }


async def _windowed(
    proto: StompProtocol,
    dest: str,
    body: bytes,
    n: int,
    per_batch: int,
    window: int,
    deadline: float,
    lim: Limits,
    lead: _Lead | None = None,
    extra: bytes = b"",
) -> dict[str, Any]:
    """Send batches whose last frame carries a receipt, ``window`` batches in flight.

    ``extra``: header lines (each starting with a newline) added to every SEND.
    """
    per_frame_dest = "{i}" in dest
    clen = str(len(body)).encode()
    tail = extra + b"\n\n" + body + NUL
    plain = (b"SEND\ndestination:" + dest.encode() + b"\ncontent-length:" + clen + tail
             if not per_frame_dest else b"")
    head = b"SEND\ndestination:"
    total_b = math.ceil(n / per_batch)
    st = {"sent_b": 0, "acked": 0, "t_last": 0.0, "stop": False}
    done = asyncio.Event()

    def frame_at(i: int, receipt: bool) -> bytes:
        d = dest.format(i=i).encode() if per_frame_dest else dest.encode()
        if not receipt and not per_frame_dest:
            return plain
        r = b"\nreceipt:" + str(i).encode() if receipt else b""
        return head + d + b"\ncontent-length:" + clen + r + tail

    def batch(j: int) -> bytes:
        lo, hi = j * per_batch, min(n, (j + 1) * per_batch)
        return b"".join([frame_at(i, i == hi - 1) for i in range(lo, hi)])

    loop = asyncio.get_running_loop()

    def pump() -> None:
        top = min(total_b, st["acked"] + window)
        if lead is not None and top > st["sent_b"]:
            room = lead.room(int(st["sent_b"]) * per_batch) // per_batch
            if room < 1:
                # Re-check soon (the receipts alone would not call us again).
                if not st["stop"]:
                    lead.waits += 1
                    loop.call_later(0.002, pump)
                return
            top = min(top, int(st["sent_b"]) + room)
        if top > st["sent_b"] and not st["stop"]:
            proto.write(b"".join([batch(j) for j in range(st["sent_b"], top)]))
            st["sent_b"] = top

    tail6 = b""

    def on_data(data: bytes) -> None:
        nonlocal tail6
        if ERROR_MARK in data or ERROR_MARK in tail6 + data[:6]:
            proto.fail(error_text(tail6 + data))
            done.set()
            return
        tail6 = data[-6:]
        c = data.count(NUL)
        if c:
            st["acked"] += c
            st["t_last"] = time.monotonic()
            if st["acked"] >= total_b:
                done.set()
            else:
                pump()

    proto.on_data = on_data

    class _C:
        @property
        def n(self) -> int:
            return int(st["acked"])

    pump()
    truncated, failure = await _watch([proto], [_C()], done, deadline, lim.stall)
    st["stop"] = True
    if failure:
        raise StompError(failure)
    acked = int(st["acked"])
    return {
        "sent": min(n, int(st["sent_b"]) * per_batch),
        "receipts": acked,
        "frames_confirmed": min(n, acked * per_batch),
        "t_last": st["t_last"] or time.monotonic(),
        "truncated": truncated,
        "per_batch": per_batch,
        "window": window,
        "lead_waits": lead.waits if lead else 0,
    }


def ping_pong(
    ctl: SyncControl, t: Target, dest: str, n: int, warmup: int, body_size: int, lim: Limits
) -> None:
    """Round trips SEND -> MESSAGE through a queue, one message in flight (blocking I/O)."""
    prod = sync_connect(t.host, t.port, t.profile, t.tls, lim.setup)
    cons = sync_connect(t.host, t.port, t.profile, t.tls, lim.setup)
    cons.request(
        subscribe_frame(t.profile, dest, "0", "auto", receipt="sub-0"), "RECEIPT", lim.setup
    )
    f = send_frame(dest, _body(body_size))
    ctl.send("ready", {"connections": 2})
    t0 = ctl.wait("go", lim.setup * 3)
    cpu0 = self_cpu()
    deadline = t0 + lim.max_seconds
    samples: list[int] = []
    rx = cons.sock
    rx.settimeout(lim.stall)
    send = prod.sock.sendall
    clock = time.perf_counter_ns
    truncated = False
    for i in range(warmup + n):
        if time.monotonic() >= deadline:
            truncated = True
            break
        a = clock()
        send(f)
        while True:
            try:
                data = rx.recv(65536)
            except TimeoutError as e:
                raise StompError(f"no message within {lim.stall:.0f}s (round trip {i})") from e
            if not data:
                raise StompError("connection lost: closed by broker")
            if NUL in data:
                break
        b = clock()
        if ERROR_MARK in data:
            raise StompError(error_text(data))
        if i >= warmup:
            samples.append(b - a)
    cpu = self_cpu() - cpu0
    samples.sort()
    ctl.send("done", {"samples_ns": samples, "t_last": time.monotonic(), "truncated": truncated, "cpu": cpu})
    try:
        ctl.wait("stop", 60)
    except StompError:
        pass
    prod.sock.close()
    cons.sock.close()


def _client_send_interval(ours: str, theirs: str | None) -> float:
    """Return how often (s) the client must send heart-beats, 0 for never."""
    try:
        cx = int(ours.split(",")[0])
        sy = int((theirs or "0,0").split(",")[1])
    except (ValueError, IndexError):
        return 0.0
    return max(cx, sy) / 1000.0 if cx and sy else 0.0


async def hold_idle(
    ctl: Control, t: Target, n: int, concurrency: int, heart_beat: str, lim: Limits
) -> None:
    """Open ``n`` idle connections (``concurrency`` attempts at a time) and hold them."""
    sem = asyncio.Semaphore(concurrency)
    conns: list[StompProtocol] = []
    errors: list[str] = []
    negotiated: list[str] = []

    async def one() -> None:
        async with sem:
            if errors:
                return
            try:
                proto, hdr = await open_connection(
                    t.host, t.port, t.profile, t.tls, heart_beat, timeout=lim.setup
                )
            except StompError as e:
                errors.append(str(e))
                return
            proto.on_data = lambda data: None
            conns.append(proto)
            if not negotiated:
                negotiated.append(hdr.get("heart-beat", "0,0"))

    cpu0 = self_cpu()
    t0 = time.monotonic()
    open_budget = lim.max_seconds + n / 50.0
    try:
        await asyncio.wait_for(asyncio.gather(*[one() for _ in range(n)]), open_budget)
    except TimeoutError as e:
        raise StompError(f"timeout: {len(conns)}/{n} connections open after {open_budget:.0f}s") from e
    seconds = time.monotonic() - t0
    if errors:
        for p in conns:
            p.close()
        raise StompError(f"{len(conns)}/{n} connections opened, then: {errors[0]}")
    interval = _client_send_interval(heart_beat, negotiated[0] if negotiated else None)

    async def beat() -> None:
        # Heart-beat at half the negotiated period; bounded by the close message.
        for _ in range(1_000_000):
            await asyncio.sleep(interval / 2)
            for p in conns:
                p.write(b"\n")

    beater = asyncio.ensure_future(beat()) if interval else None
    ctl.send(
        "ready",
        {
            "opened": len(conns),
            "seconds": seconds,
            "cpu": self_cpu() - cpu0,
            "heart_beat_sent": heart_beat,
            "heart_beat_broker": negotiated[0] if negotiated else None,
            "client_beat_interval_s": interval,
        },
    )
    try:
        await ctl.wait("close", 3600)
    finally:
        if beater:
            beater.cancel()
    dropped = sum(1 for p in conns if p.closed.done())
    ctl.send("done", {"dropped": dropped})
    for p in conns:
        p.close()
    await asyncio.sleep(0.1)


async def hold_wildcards(
    ctl: Control, t: Target, n: int, pattern: str, per_conn: int, lim: Limits
) -> None:
    """Hold ``n`` wildcard subscriptions (``pattern.format(i=...)``), ``per_conn`` per connection."""
    conns: list[StompProtocol] = []
    t0 = time.monotonic()
    deadline = t0 + lim.max_seconds + n / 500.0
    i = 0
    while i < n:
        proto, _ = await open_connection(
        t.host, t.port, t.profile, t.tls, timeout=lim.setup, ws_path=t.ws_path, ws_batch=t.ws_batch
    )
        proto.transport.set_write_buffer_limits(high=1 << 20)  # type: ignore[union-attr]
        conns.append(proto)
        top = min(n, i + per_conn)
        while i < top:
            chunk = min(top, i + 500)
            frames = [
                subscribe_frame(t.profile, pattern.format(i=k), f"w{k}", "auto",
                                receipt=f"w{k}" if k == chunk - 1 else None)
                for k in range(i, chunk)
            ]
            left = deadline - time.monotonic()
            if left <= 0:
                raise StompError(f"timeout: {i}/{n} wildcard subscriptions after {time.monotonic() - t0:.0f}s")
            try:
                await proto.request(b"".join(frames), "RECEIPT", min(left, lim.stall))
            except StompError as e:
                raise StompError(f"{e} ({i}/{n} subscriptions done in {time.monotonic() - t0:.0f}s)") from e
            i = chunk
        proto.on_data = lambda data: None
    ctl.send("ready", {"subscriptions": n, "connections": len(conns), "seconds": time.monotonic() - t0})
    try:
        await ctl.wait("close", 3600)
    finally:
        ctl.send("done", {"dropped": sum(1 for p in conns if p.closed.done())})
        for p in conns:
            p.close()
        await asyncio.sleep(0.1)
