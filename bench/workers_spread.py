"""How evenly do two worker processes share the connections of one port?

Three ways for N worker processes to take the connections of one TCP port
(docs/workers.rst, "Sharing the listeners"), each measured with the same
tiny Twisted worker (it writes its name on each new connection and keeps
the connection open), so that only the sharing differs:

  reuseport  each worker binds the port itself with SO_REUSEPORT
             (L{qmq.workers.sharing.ReusePortReactor}, what QMQ uses): the
             kernel picks a worker by a hash of the connection's addresses;
  shared     the parent binds the port once and every worker listens on
             that one socket (C{adoptStreamPort}): whichever worker wakes
             first accepts;
  handoff    the parent accepts every connection and passes its descriptor
             to the workers in turn over a unix socket (SCM_RIGHTS); each
             worker adopts it (C{adoptStreamConnection}).

For each, C{--connections} clients connect (a burst: all at once, then a
sequence: one after the other), each reads the worker's name; the script
prints the count per worker, the time until the last name was read, and the
parent's CPU time (the handoff parent is on the path of every connection).

Run: C{PYTHONPATH=. python bench/workers_spread.py [--connections 100]
[--workers 2] [--rounds 3]}.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections import Counter

MODES = ("reuseport", "shared", "handoff")


def worker(mode: str, name: str, port: int, fd: int) -> None:
    """One worker: serve until stdin closes."""
    from twisted.internet import reactor, stdio  # noqa: PLC0415
    from twisted.internet.interfaces import IFileDescriptorReceiver  # noqa: PLC0415
    from twisted.internet.protocol import Factory, Protocol  # noqa: PLC0415
    from zope.interface import implementer  # noqa: PLC0415

    from qmq.workers.sharing import ReusePortReactor  # noqa: PLC0415

    held = []

    class Hello(Protocol):
        def connectionMade(self) -> None:
            held.append(self)
            self.transport.write(name.encode() + b"\n")

    factory = Factory.forProtocol(Hello)
    if mode == "reuseport":
        ReusePortReactor(reactor).listenTCP(port, factory, 1024, "127.0.0.1")
    elif mode == "shared":
        reactor.adoptStreamPort(fd, socket.AF_INET, factory)
    else:

        @implementer(IFileDescriptorReceiver)
        class Receiver(Protocol):
            def fileDescriptorReceived(self, descriptor: int) -> None:
                reactor.adoptStreamConnection(descriptor, socket.AF_INET, factory)
                os.close(descriptor)

        reactor.adoptStreamConnection(fd, socket.AF_UNIX, Factory.forProtocol(Receiver))

    class Stop(Protocol):
        def connectionLost(self, reason: object = None) -> None:
            reactor.stop()

    stdio.StandardIO(Stop())
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    reactor.run()


def start_workers(mode: str, count: int, port: int) -> tuple[list[subprocess.Popen[bytes]], list[socket.socket], socket.socket | None]:
    listener = None
    parents: list[socket.socket] = []
    processes = []
    if mode in ("shared", "handoff"):
        listener = socket.create_server(("127.0.0.1", port), backlog=1024)
    for index in range(count):
        fd = -1
        if mode == "shared":
            assert listener is not None
            listener.setblocking(False)
            fd = listener.fileno()
        elif mode == "handoff":
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            parents.append(parent)
            fd = child.fileno()
        process = subprocess.Popen(
            [sys.executable, __file__, "--worker", mode, f"w{index}", str(port), str(fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(fd,) if fd >= 0 else (),
        )
        assert process.stdout is not None
        process.stdout.readline()
        processes.append(process)
    if mode == "handoff":
        assert listener is not None
        listener.setblocking(True)
    return processes, parents, listener


def handoff_loop(listener: socket.socket, parents: list[socket.socket], expected: int) -> None:
    """The handing parent: accept and pass each descriptor on, in turn."""
    for n in range(expected):
        conn, _ = listener.accept()
        socket.send_fds(parents[n % len(parents)], [b"x"], [conn.fileno()])
        conn.close()


def clients(port: int, count: int, burst: bool) -> tuple[Counter[str], float]:
    started = time.perf_counter()
    socks = []
    names: Counter[str] = Counter()
    selector = selectors.DefaultSelector()
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        socks.append(s)
        if not burst:
            names[s.recv(64).decode().strip()] += 1
    if burst:
        for s in socks:
            selector.register(s, selectors.EVENT_READ)
        left = len(socks)
        while left:
            for key, _ in selector.select(10):
                names[key.fileobj.recv(64).decode().strip()] += 1  # type: ignore[union-attr]
                selector.unregister(key.fileobj)
                left -= 1
    elapsed = time.perf_counter() - started
    for s in socks:
        s.close()
    return names, elapsed


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import threading  # noqa: PLC0415

    for mode in MODES:
        for burst in (True, False):
            for _ in range(args.rounds):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                processes, parents, listener = start_workers(mode, args.workers, port)
                cpu = resource.getrusage(resource.RUSAGE_SELF)
                thread = None
                if mode == "handoff":
                    assert listener is not None
                    thread = threading.Thread(target=handoff_loop, args=(listener, parents, args.connections))
                    thread.start()
                names, elapsed = clients(port, args.connections, burst)
                if thread is not None:
                    thread.join()
                after = resource.getrusage(resource.RUSAGE_SELF)
                used = (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
                spread = " ".join(f"{k}={v}" for k, v in sorted(names.items()))
                print(
                    f"{mode:9} {'burst' if burst else 'sequence':8} {spread:16} "
                    f"last name after {elapsed * 1000:6.1f} ms; bench process CPU {used * 1000:5.1f} ms"
                )
                for process in processes:
                    assert process.stdin is not None
                    process.stdin.close()
                    process.wait(10)
                for p in parents:
                    p.close()
                if listener is not None:
                    listener.close()


if __name__ == "__main__":
    main()
