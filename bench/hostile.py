#!/usr/bin/env python3
"""Hostile-client scenario runner: attack one STOMP broker, measure the damage.

Every attack is bounded in count and time, cleans up its own sockets, and
runs while a CANARY client (its own forked process, so the attackers' CPU
does not inflate its latency) does receipted round trips on a queue of its
own: SEND with a receipt to a queue it is subscribed to; one round trip is
SEND -> RECEIPT and the MESSAGE back. A monitor process samples the
broker's RSS and open file descriptors every 0.25 s.

For each attack (and variant) it prints one JSON line, then a summary
table: canary p99 and worst round trip during the attack, broker RSS
before/peak/after, sockets the broker should have closed but did not,
messages receipted vs delivered, and PASS/FAIL against stated thresholds
(canary p99 < 50 ms and worst < 500 ms unless noted; no receipted message
lost; closed within the deadline).

Examples::

    # start QMQ from this working tree, run everything scaled down (~2-3 min)
    python bench/hostile.py --start --quick

    # the full run against the last commit that starts ("before" figures)
    python bench/hostile.py --start --source-commit 76139e8 --out /tmp/hostile.jsonl

    # an already running broker (its PID is found by port)
    python bench/hostile.py --port 61613 --tls-port 61614 --attacks nul-inject,tls-close

Attacks (``--attacks``; groups in brackets): [topic-bomb] [nul-inject]
[tls-close] (also TCP) [memory: flood, durable-flood, partial-bodies,
transactions] [quadratic: fanout-subs, cumulative-ack, nack-paused]
[small: half-frame, hb-digits, nack-requeue, stray-bytes, error-excerpt,
nack-forever, sub-unsub] [conn-cap]. See bench/README.rst.

Only 127.0.0.1 (the canary binds 127.0.0.2 as its source address, so a
per-address connection cap aimed at the attackers does not hit it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from hostile_wire import (  # noqa: E402
    ACK_RE,
    NUL,
    Conn,
    WireError,
    client_context,
    client_hello,
    close_all,
    connect_frame,
    frame,
    make_cert,
    nul_split_frames,
    open_many,
    parse_frames,
    watch,
)
from procstat import cpu_seconds, pid_by_port, raise_nofile, rss_kib, system_busy_seconds  # noqa: E402

_CTX = multiprocessing.get_context("fork")
MiB = 1024 * 1024

# Default thresholds (the "stated thresholds" of every PASS/FAIL).
CANARY_P99_MS = 50.0
CANARY_WORST_MS = 500.0


def now_ns() -> int:
    return time.monotonic_ns()


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# =============================================================== canary process
# Shared int64 array: a header, then (start_ns, latency_ns) pairs in a ring.
C_COUNT, C_INFLIGHT, C_LAST_OK, C_FAIL, C_RECEIPTED, C_DELIVERED, C_RECONNECTS, C_STOP, \
    C_LOST, C_DONE, C_CONNECTED, C_ERRORS = range(12)
C_HEADER = 16
C_SLOTS = 1 << 19


def canary_main(arr: Any, host: str, port: int, source: str | None, queue: str,
                interval: float, rtt_timeout: float) -> None:
    """The canary's loop (runs in its own process until ``arr[C_STOP]``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    receipted: set[int] = set()
    delivered: set[int] = set()
    conn: Conn | None = None
    seq = 0
    dest = f"/queue/{queue}"

    def connect() -> Conn:
        deadline = time.monotonic() + 5.0
        try:
            c = Conn.open(host, port, deadline, source=source)
        except WireError:
            if not source:
                raise
            c = Conn.open(host, port, deadline)  # no 127.0.0.2 on this host
        c.stomp_connect(deadline)
        c.send(frame("SUBSCRIBE", {"id": "canary", "destination": dest, "ack": "auto",
                                   "receipt": "sub"}), deadline)
        c.expect("RECEIPT", deadline)
        return c

    def absorb(c: Conn) -> list[tuple[str, dict[str, str], bytes]]:
        frames, used = parse_frames(c.buf)
        del c.buf[:used]
        for cmd, _h, body in frames:
            if cmd == "MESSAGE" and body.isdigit():
                delivered.add(int(body))
        return frames

    while not arr[C_STOP]:
        if conn is None:
            try:
                conn = connect()
                arr[C_CONNECTED] = 1
            except WireError:
                arr[C_ERRORS] += 1
                time.sleep(0.2)
                continue
        seq += 1
        t0 = now_ns()
        arr[C_INFLIGHT] = t0
        deadline = time.monotonic() + rtt_timeout
        rid = f"c{seq}"
        ok = False
        try:
            conn.send(frame("SEND", {"destination": dest, "receipt": rid}, b"%d" % seq), deadline)
            got_r = got_m = False
            while True:
                for cmd, h, body in absorb(conn):
                    if cmd == "RECEIPT" and h.get("receipt-id") == rid:
                        got_r = True
                        receipted.add(seq)
                    elif cmd == "MESSAGE" and body == b"%d" % seq:
                        got_m = True
                    elif cmd == "ERROR":
                        raise WireError("ERROR: " + h.get("message", ""))
                if got_r and got_m:
                    break
                if conn.eof:
                    raise WireError("closed")
                conn._wait_readable(deadline)
                conn.pump()
            ok = True
        except WireError:
            pass
        t1 = now_ns()
        i = arr[C_COUNT] % C_SLOTS
        arr[C_HEADER + 2 * i] = t0
        arr[C_HEADER + 2 * i + 1] = (t1 - t0) if ok else -(t1 - t0)
        arr[C_COUNT] += 1
        arr[C_INFLIGHT] = 0
        if ok:
            arr[C_LAST_OK] = t1
        else:
            arr[C_FAIL] += 1
            arr[C_RECONNECTS] += 1
            arr[C_CONNECTED] = 0
            conn.close()  # type: ignore[union-attr]
            conn = None
        arr[C_RECEIPTED] = len(receipted)
        arr[C_DELIVERED] = len(delivered)
        if interval:
            time.sleep(interval)
    # Final drain: every receipted message must come back, late or not.
    deadline = time.monotonic() + 10.0
    while receipted - delivered and time.monotonic() < deadline:
        try:
            if conn is None:
                conn = connect()
            conn._wait_readable(min(deadline, time.monotonic() + 1.0))
            conn.pump()
            absorb(conn)
            if conn.eof:
                conn.close()
                conn = None
        except WireError:
            if conn is not None and conn.eof:
                conn.close()
                conn = None
    arr[C_RECEIPTED] = len(receipted)
    arr[C_DELIVERED] = len(receipted & delivered)
    arr[C_LOST] = len(receipted - delivered)
    arr[C_DONE] = 1
    if conn is not None:
        conn.close()


# =============================================================== monitor process
M_COUNT, M_PID, M_STOP = range(3)
M_HEADER = 8
M_SLOTS = 1 << 16  # 4.5 hours at 4 samples a second


def monitor_main(arr: Any, period: float) -> None:
    """Sample the broker's RSS (KiB), CPU ticks and open fds every ``period`` s."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while not arr[M_STOP]:
        pid = arr[M_PID]
        if pid:
            rss = rss_kib(pid, tree=False)
            try:
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                fds = -1
            try:
                cpu = int(cpu_seconds(pid, tree=False) * 100)
            except OSError:
                cpu = -1
            i = arr[M_COUNT] % M_SLOTS
            base = M_HEADER + 4 * i
            arr[base], arr[base + 1], arr[base + 2], arr[base + 3] = now_ns(), rss, fds, cpu
            arr[M_COUNT] += 1
        time.sleep(period)


def _fork(target: Callable[..., None], *args: Any) -> multiprocessing.process.BaseProcess:
    def entry() -> None:
        try:
            target(*args)
        except Exception:  # noqa: BLE001 - a crashed helper must not hang the parent
            traceback.print_exc()
        finally:
            os._exit(0)

    p = _CTX.Process(target=entry, daemon=True)
    p.start()
    return p


# =============================================================== the broker
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


class BrokerProc:
    """A QMQ broker this runner started (``--start``): ``twistd -n qmq``."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.source = Path(args.source).resolve()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "broker.log"
        self.port = args.port or free_port()
        self.tls_port = None if args.no_tls else (args.tls_port or free_port())
        self.key = self.cert = None
        if self.tls_port:
            self.key, self.cert = make_cert(workdir / "tls")
        self.generation = 0
        self.env = dict(os.environ, PYTHONPATH=str(self.source) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.default_config = self._default_config()
        self.known_stomp = set(self.default_config.get("stomp", {})) | self._settings_fields()
        self.config_path, self.applied, self.dropped = self._write_config()

    def _twistd(self) -> str:
        return str(Path(sys.executable).parent / "twistd")

    def _default_config(self) -> dict[str, Any]:
        r = subprocess.run([self._twistd(), "qmq", "--print-default-config"], env=self.env,
                           capture_output=True, text=True, timeout=60, cwd=self.workdir)
        try:
            return tomllib.loads(r.stdout)
        except tomllib.TOMLDecodeError:
            return {}

    def _settings_fields(self) -> set[str]:
        code = ("import dataclasses; from qmq.stomp.settings import StompSettings; "
                "print(' '.join(f.name for f in dataclasses.fields(StompSettings)))")
        r = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                           timeout=60, cwd=self.workdir)  # not the repo: "" is first on sys.path
        return set(r.stdout.split()) if r.returncode == 0 else set()

    def _write_config(self) -> tuple[Path | None, dict[str, Any], list[str]]:
        """The config passed to the broker: --config as is, else short timeouts
        so close paths are checkable (keys this broker does not know are dropped)."""
        if self.args.config:
            return Path(self.args.config).resolve(), {}, []
        wanted: dict[str, Any] = {
            "stomp.connect_timeout": 2.0,
            "stomp.heartbeat_receive_ms": 1000,
            "stomp.idle_timeout": 10.0,
            "stomp.frame_timeout": 10.0,
        }
        for item in self.args.set or []:
            k, _, v = item.partition("=")
            wanted[k.strip()] = _parse_value(v.strip())
        applied: dict[str, Any] = {}
        dropped: list[str] = []
        tables: dict[str, dict[str, Any]] = {}
        for key, value in wanted.items():
            table, _, name = key.rpartition(".")
            if table == "stomp" and name not in self.known_stomp and key not in (self.args.set_force or []):
                dropped.append(key)
                continue
            tables.setdefault(table, {})[name] = value
            applied[key] = value
        lines = ["# written by bench/hostile.py"]
        # Top-level keys (--set store=memory) before any [table].
        for table, items in sorted(tables.items(), key=lambda kv: kv[0] != ""):
            if table:
                lines.append(f"[{table}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in items.items())
        path = self.workdir / "hostile.toml"
        path.write_text("\n".join(lines) + "\n")
        return path, applied, dropped

    def effective(self) -> dict[str, Any]:
        """The [stomp] settings the broker runs with (defaults, then our config)."""
        eff = dict(self.default_config.get("stomp", {}))
        if self.config_path is not None:
            try:
                eff.update(tomllib.loads(self.config_path.read_text()).get("stomp", {}))
            except (OSError, tomllib.TOMLDecodeError):
                pass
        return eff

    def start(self, fresh: bool = True) -> None:
        data = self.workdir / "data"
        if fresh:
            shutil.rmtree(data, ignore_errors=True)
        cmd = [self._twistd(), "-n", "--pidfile=", "qmq",
               "--listen", f"stomp:tcp:{self.port}:interface=127.0.0.1:backlog=1024",
               "--data-dir", str(data)]
        if self.tls_port:
            cmd += ["--listen", f"stomp:ssl:{self.tls_port}:privateKey={self.key}:certKey={self.cert}"
                    ":interface=127.0.0.1:backlog=1024"]
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        self.generation += 1
        with open(self.log_path, "ab") as f:
            f.write(f"\n===== hostile.py: broker start #{self.generation} =====\n".encode())
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=logf, stderr=logf,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None and not port_open(self.port):
            time.sleep(0.1)
        if not port_open(self.port):
            self.stop()
            raise RuntimeError("broker did not start: " + self.log_path.read_text(errors="replace")[-1500:])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.pid is not None

    def stop(self, grace: float = 8.0) -> None:
        """SIGTERM, SIGKILL after ``grace`` (a broker stuck in a loop never runs its handler)."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.proc = None

    def restart(self, fresh: bool = True) -> None:
        self.stop(grace=3.0)
        for _ in range(50):
            if not port_open(self.port):
                break
            time.sleep(0.1)
        self.start(fresh=fresh)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read(8 * MiB).decode("utf-8", "replace")
        except OSError:
            return ""


def scan_tracebacks(text: str) -> dict[str, Any]:
    """Count 'Traceback' / 'Unhandled' in broker log text; keep the exception lines."""
    n_tb = text.count("Traceback (most recent call last)")
    n_unh = text.count("Unhandled")
    exc = []
    for m in re.finditer(r"\n\t?(?:builtins\.)?([A-Za-z_.]*(?:Error|Exception)[^\n]{0,160})", text):
        line = m.group(1).strip()
        if line not in exc and not line.startswith("File"):
            exc.append(line)
    return {"tracebacks": n_tb, "unhandled": n_unh, "exceptions": exc[:5]}


# =============================================================== results
@dataclasses.dataclass
class Result:
    attack: str
    variant: str
    t0: int = 0
    t1: int = 0
    status: str = "PASS"
    reasons: list[str] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    canary: dict[str, Any] = dataclasses.field(default_factory=dict)
    rss_mib: dict[str, Any] = dataclasses.field(default_factory=dict)
    fds: dict[str, Any] = dataclasses.field(default_factory=dict)
    log: dict[str, Any] = dataclasses.field(default_factory=dict)
    p99_limit_ms: float = CANARY_P99_MS
    worst_limit_ms: float = CANARY_WORST_MS
    canary_applies: bool = True
    note: str = ""
    #: name -> (t0, t1) monotonic ns: the canary is also reported per phase.
    phases: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def phase(self, name: str, t0: int) -> None:
        """Mark the phase ``name`` as running from ``t0`` until now."""
        self.phases[name] = (t0, now_ns())

    def fail(self, reason: str) -> None:
        self.reasons.append(reason)
        if self.status == "PASS":
            self.status = "FAIL"

    def check(self, ok: bool, reason: str) -> bool:
        if not ok:
            self.fail(reason)
        return ok

    @property
    def name(self) -> str:
        return f"{self.attack}/{self.variant}" if self.variant else self.attack

    def as_json(self) -> dict[str, Any]:
        d = {"attack": self.attack, "variant": self.variant, "status": self.status,
             "reasons": self.reasons, "duration_s": round((self.t1 - self.t0) / 1e9, 2),
             "canary": self.canary, "rss_mib": self.rss_mib, "broker_fds": self.fds}
        if self.log:
            d["broker_log"] = self.log
        if self.note:
            d["note"] = self.note
        d.update(self.data)
        return d


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[k]


# =============================================================== context
class Unhealthy(Exception):
    """The broker stopped answering and cannot be restarted: stop the run."""


class Ctx:
    """What every attack gets: addresses, knobs, measurement, clean-up helpers."""

    def __init__(self, args: argparse.Namespace, broker: BrokerProc | None, settings: dict[str, Any]) -> None:
        self.args = args
        self.broker = broker
        self.host = "127.0.0.1"
        self.port = broker.port if broker else args.port
        self.tls_port = broker.tls_port if broker else args.tls_port
        self.quick = args.quick
        self.settings = settings
        self.run = os.urandom(3).hex()
        self.results: list[Result] = []
        self.tls = client_context()
        self.out = open(args.out, "a") if args.out else None  # noqa: SIM115
        self.pid = args.pid or (broker.pid if broker else pid_by_port(self.port))
        self.canary_arr = _CTX.RawArray("q", C_HEADER + 2 * C_SLOTS)
        self.mon_arr = _CTX.RawArray("q", M_HEADER + 4 * M_SLOTS)
        self.mon_arr[M_PID] = self.pid or 0
        self.canary_proc = None
        self.monitor_proc = None
        self.restarts: list[str] = []

    # -- knobs
    def n(self, full: int, quick: int) -> int:
        v = quick if self.quick else full
        return max(1, int(v * self.args.scale))

    def t(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    def phase(self) -> float:
        """Deadline of one phase of a quadratic-path attack."""
        return self.args.phase_deadline if not self.quick else min(self.args.phase_deadline, 40.0)

    def q(self, name: str) -> str:
        return f"hostile-{self.run}-{name}"

    def setting(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    # -- helpers processes
    def start_helpers(self) -> None:
        source = self.args.canary_source or None
        self.canary_proc = _fork(canary_main, self.canary_arr, self.host, self.port, source,
                                 self.q("canary"), self.args.canary_interval / 1000.0, self.args.rtt_timeout)
        self.monitor_proc = _fork(monitor_main, self.mon_arr, 0.25)
        deadline = time.monotonic() + 15
        while not self.canary_arr[C_LAST_OK] and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.canary_arr[C_LAST_OK]:
            raise RuntimeError("the canary could not do a single round trip within 15 s")
        time.sleep(1.0)  # a baseline

    def stop_helpers(self) -> dict[str, Any]:
        self.canary_arr[C_STOP] = 1
        deadline = time.monotonic() + 15
        while not self.canary_arr[C_DONE] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.mon_arr[M_STOP] = 1
        for p in (self.canary_proc, self.monitor_proc):
            if p is not None:
                p.join(3)
                if p.is_alive():
                    p.kill()
        a = self.canary_arr
        return {"round_trips": a[C_COUNT], "failed": a[C_FAIL], "reconnects": a[C_RECONNECTS],
                "receipted": a[C_RECEIPTED], "delivered": a[C_DELIVERED], "lost": a[C_LOST],
                "connect_errors": a[C_ERRORS]}

    # -- measurement
    def canary_window(self, t0: int, t1: int) -> dict[str, Any]:
        a = self.canary_arr
        count = a[C_COUNT]
        lat: list[float] = []
        failed = 0
        for k in range(max(0, count - C_SLOTS), count):
            i = k % C_SLOTS
            start, d = a[C_HEADER + 2 * i], a[C_HEADER + 2 * i + 1]
            end = start + abs(d)
            if end < t0 or start > t1:
                continue
            lat.append(abs(d) / 1e6)
            if d < 0:
                failed += 1
        inflight = a[C_INFLIGHT]
        inflight_ms = 0.0
        if inflight and inflight < t1:
            inflight_ms = (t1 - inflight) / 1e6
            lat.append(inflight_ms)
        if not lat:
            return {"n": 0}
        return {"n": len(lat), "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
                "worst_ms": round(max(lat), 1), "failed": failed,
                "in_flight_ms": round(inflight_ms, 1) if inflight_ms else 0}

    def monitor_window(self, t0: int, t1: int) -> tuple[float, float, int]:
        a = self.mon_arr
        count = a[M_COUNT]
        peak_rss = 0
        peak_fds = 0
        cpu0 = cpu1 = None
        for k in range(max(0, count - M_SLOTS), count):
            base = M_HEADER + 4 * (k % M_SLOTS)
            t = a[base]
            if t0 <= t <= t1:
                peak_rss = max(peak_rss, a[base + 1])
                peak_fds = max(peak_fds, a[base + 2])
                if cpu0 is None:
                    cpu0 = a[base + 3]
                cpu1 = a[base + 3]
        cpu = ((cpu1 or 0) - (cpu0 or 0)) / 100.0
        return peak_rss / 1024.0, cpu, peak_fds

    def broker_rss(self) -> float:
        return rss_kib(self.pid, tree=False) / 1024.0 if self.pid else float("nan")

    def broker_fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except (OSError, TypeError):
            return -1

    @contextlib.contextmanager
    def measure(self, attack: str, variant: str = "",
                window: tuple[int, int] | None = None) -> Iterator[Result]:
        """Measure one attack window; print its JSON line at the end.

        ``window`` (monotonic ns) replaces the block's own duration, for
        probes that all ran together in one shared window."""
        r = Result(attack, variant)
        log(f"attack {r.name}")
        rss0 = self.broker_rss()
        fds0 = self.broker_fds()
        log_off = self.broker.log_size() if self.broker else 0
        busy0 = system_busy_seconds()
        r.t0 = now_ns()
        try:
            yield r
        except WireError as e:
            r.fail(f"attack client error: {e}")
            r.status = "ERROR" if r.status == "PASS" else r.status
        except Unhealthy:
            raise
        except Exception as e:  # noqa: BLE001 - report and go on with the next attack
            r.status = "ERROR"
            r.reasons.append(f"{type(e).__name__}: {e}")
            r.data["traceback"] = traceback.format_exc(limit=4)
        r.data["attack_s"] = round((now_ns() - r.t0) / 1e9, 2)
        if window is None:
            # At least one canary round trip must fall inside the window: wait
            # (bounded) for one that started after the attack did.
            wait_until = time.monotonic() + 5.0
            while time.monotonic() < wait_until and self.canary_arr[C_LAST_OK] < r.t0:
                time.sleep(0.01)
        r.t1 = now_ns()
        if window is not None:
            r.t0, r.t1 = window
        busy1 = system_busy_seconds()
        time.sleep(0.5)
        r.canary = self.canary_window(r.t0, r.t1)
        for name, (a, b) in r.phases.items():
            r.data[f"canary_{name}"] = self.canary_window(a, b)
        peak, cpu, peak_fds = self.monitor_window(r.t0, r.t1)
        rss1 = self.broker_rss()
        r.rss_mib = {"before": round(rss0, 1), "peak": round(max(peak, rss0, rss1 if rss1 == rss1 else 0), 1),
                     "after": round(rss1, 1)}
        r.fds = {"before": fds0, "peak": max(peak_fds, fds0), "after": self.broker_fds()}
        wall = (r.t1 - r.t0) / 1e9
        r.data.setdefault("broker_cpu_s", round(max(cpu, 0.0), 2))
        r.data.setdefault("machine_busy_cores", round((busy1 - busy0) / wall, 2) if wall > 0 else 0)
        if self.broker:
            r.log = scan_tracebacks(self.broker.log_since(log_off))
            if r.log["tracebacks"] or r.log["unhandled"]:
                r.fail(f"broker logged {r.log['tracebacks']} traceback(s): "
                       f"{'; '.join(r.log['exceptions'][:2]) or '?'}")
        if r.canary_applies and r.status != "SKIP":
            c = r.canary
            if not c.get("n"):
                r.fail("no canary round trip during the attack")
            else:
                r.check(c["p99_ms"] < r.p99_limit_ms, f"canary p99 {c['p99_ms']} ms >= {r.p99_limit_ms:g} ms")
                r.check(c["worst_ms"] < r.worst_limit_ms,
                        f"canary worst {c['worst_ms']} ms >= {r.worst_limit_ms:g} ms")
        line = json.dumps(r.as_json(), default=str)
        print(line, flush=True)
        if self.out:
            self.out.write(line + "\n")
            self.out.flush()
        self.results.append(r)
        log(f"  -> {r.status} {'; '.join(r.reasons)[:300]}")

    # -- health
    def healthy(self, timeout: float) -> bool:
        """True once the canary completes a round trip started after now."""
        mark = now_ns()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.canary_arr[C_LAST_OK] > mark:
                return True
            if self.broker and not self.broker.alive():
                return False
            time.sleep(0.05)
        return False

    def broker_idle(self, timeout: float, busy: float = 0.6) -> bool:
        """True once the broker used less than ``busy`` of a core over half a
        second (it finished the work an attack left in its buffers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                c0 = cpu_seconds(self.pid, tree=False)
                time.sleep(0.5)
                c1 = cpu_seconds(self.pid, tree=False)
            except (OSError, TypeError):
                return False
            if c1 - c0 < busy / 2:
                return True
        return False

    def ensure_healthy(self, after: str, timeout: float | None = None) -> None:
        """After an attack: wait until the broker answers the canary and is idle
        again; restart it (``--start``) if it stays stuck or busy."""
        timeout = self.args.recover if timeout is None else timeout
        t_end = time.monotonic() + timeout
        answers = self.healthy(timeout)
        if answers and self.broker_idle(max(1.5, t_end - time.monotonic())):
            return
        if self.broker is None:
            if answers:
                log(f"broker still busy {timeout:g} s after {after}; going on")
                return
            raise Unhealthy(f"broker unresponsive {timeout:g} s after {after}; stopping the run")
        why = "dead" if not self.broker.alive() else f"unresponsive or busy for {timeout:g} s"
        log(f"broker {why} after {after}: restarting it (fresh data directory)")
        self.restart(f"{after}: broker {why}", fresh=True)

    def restart(self, why: str, fresh: bool = True) -> None:
        assert self.broker is not None
        self.broker.restart(fresh=fresh)
        self.pid = self.broker.pid
        self.mon_arr[M_PID] = self.pid or 0
        self.restarts.append(why)
        if not self.healthy(30):
            raise Unhealthy(f"broker not healthy after a restart ({why})")

    # -- connections
    def deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds

    def connect(self, seconds: float = 10.0, version: str = "1.2", tls: bool = False,
                heart_beat: str | None = "0,0", extra: tuple = (), rcvbuf: int | None = None) -> Conn:
        d = self.deadline(seconds)
        port = self.tls_port if tls else self.port
        c = Conn.open(self.host, port, d, tls=self.tls if tls else None, rcvbuf=rcvbuf)
        try:
            c.stomp_connect(d, version, heart_beat, extra)
        except WireError:
            c.close()
            raise
        return c


# =============================================================== attack helpers
def send_frames(c: Conn, frames: list[bytes], deadline: float, batch: int = 1000,
                drain: bool = True) -> int:
    """Write ``frames`` in batches (reading what comes back); return how many were written."""
    done = 0
    for i in range(0, len(frames), batch):
        if time.monotonic() > deadline or c.eof:
            break
        c.send(b"".join(frames[i:i + batch]), deadline)
        done += len(frames[i:i + batch])
        if drain:
            c.pump()
    return done


def refused_while_sending(c: Conn, e: WireError) -> str:
    """Why the broker cut ``c`` off while we were still sending: its ERROR
    (which may still wait in our receive buffer), else the wire error."""
    with contextlib.suppress(OSError, WireError):
        c._pull()
    err = error_of(c)
    return f"ERROR {err[1].get('message', '')}" if err else str(e)


def memory_alarm_on(ctx: Ctx) -> bool | None:
    """Ask the broker (/control/memory, QMQ's) whether its memory alarm is on;
    None if it does not say."""
    try:
        c = ctx.connect()
    except Exception:
        return None
    try:
        d = ctx.deadline(5)
        c.send(frame("SEND", {"destination": "/control/memory", "receipt": "m"}), d)
        ok, _ = wait_receipt(c, "m", d, keep=True)
        if not ok:
            return None
        frames, _ = parse_frames(c.buf)
        for f in frames:
            if f[0] == "RECEIPT" and "memory-alarm" in f[1]:
                return f[1]["memory-alarm"] == "on"
        return None
    except WireError:
        return None
    finally:
        c.close()


def wait_receipt(c: Conn, rid: str, deadline: float, keep: bool = False) -> tuple[bool, str]:
    """Read until the RECEIPT ``rid`` (True) or an ERROR / close / deadline (False, why)."""
    needle = f"receipt-id:{rid}\n".encode()
    pos = 0
    while True:
        i = c.buf.find(needle, max(0, pos - len(needle)))
        if i >= 0:
            if not keep:
                del c.buf[: c.buf.find(NUL, i) + 1]
            return True, ""
        e = c.buf.find(b"ERROR\n")
        if e >= 0 and (e == 0 or c.buf[e - 1] in (0, 10)):
            frames, _ = parse_frames(c.buf[e:])
            msg = frames[0][1].get("message", "") if frames else ""
            return False, f"ERROR {msg}"
        if c.eof:
            return False, "closed"
        pos = len(c.buf)
        if not keep and len(c.buf) > 8 * MiB:
            cut = c.buf.rfind(NUL)
            del c.buf[: cut + 1]
            pos = 0
        try:
            c._wait_readable(deadline)
        except WireError:
            return False, "timeout"
        c.pump()


def error_of(c: Conn) -> tuple[str, dict[str, str], bytes] | None:
    """The first ERROR frame in the connection's buffer, if any."""
    frames, _ = parse_frames(c.buf)
    for f in frames:
        if f[0] == "ERROR":
            return f
    return None


def publish(ctx: Ctx, dest: str, count: int, body_size: int = 100, seconds: float = 60.0) -> bool:
    """Put ``count`` messages on ``dest`` (pipelined, one receipt at the end)."""
    c = ctx.connect()
    try:
        d = ctx.deadline(seconds)
        pad = b"x" * max(0, body_size - 12)
        frames = [frame("SEND", {"destination": dest}, b"%012d" % i + pad) for i in range(count - 1)]
        frames.append(frame("SEND", {"destination": dest, "receipt": "pub-end"}, b"%012d" % (count - 1) + pad))
        send_frames(c, frames, d, batch=2000)
        ok, _ = wait_receipt(c, "pub-end", d)
        return ok
    finally:
        c.abort()


# =============================================================== 6. small attacks
def attack_hb_digits(ctx: Ctx) -> None:
    """6b: a heart-beat header with 400 digits: an ERROR, no crash, no traceback."""
    variants = {
        "cx-400-digits": "9" * 400 + ",0",
        "cy-400-digits": "0," + "9" * 400,
        "both-400-digits": "1" * 400 + "," + "1" * 400,
        "cx-300-digits": "9" * 300 + ",0",
    }
    for name, value in variants.items():
        with ctx.measure("hb-digits", name) as r:
            d = ctx.deadline(5)
            c = Conn.open(ctx.host, ctx.port, d)
            try:
                c.send(frame("CONNECT", [("accept-version", "1.2"), ("host", "/"), ("heart-beat", value)]), d)
                c.wait_for(lambda c: b"ERROR\n" in c.buf or c.eof, d)
                frames, _ = parse_frames(c.buf)
                cmds = [f[0] for f in frames]
                r.data["frames"] = cmds
                err = error_of(c)
                r.data["error_message"] = err[1].get("message") if err else None
                # If it was accepted, is the session usable (a receipted SEND)?
                if "CONNECTED" in cmds and not c.eof and err is None:
                    try:
                        c.send(frame("SEND", {"destination": "/queue/" + ctx.q("hb"), "receipt": "x"}, b"x"), d)
                        ok, why = wait_receipt(c, "x", d)
                        r.data["session_usable"] = ok
                    except WireError as e:
                        r.data["session_usable"] = f"no: {e}"
                watch([c], ctx.deadline(3))
                r.data["closed_by_broker"] = c.eof
                r.check(err is not None, f"no ERROR for heart-beat {value[:12]}... (frames: {cmds})")
                if err is not None:
                    r.check(err[1].get("message") != "internal error",
                            "ERROR is 'internal error' (an unhandled exception in the broker)")
                    r.check(c.eof, "not closed within 3 s after the ERROR")
            finally:
                c.close()
            time.sleep(0.3)  # let the broker's log catch up


def attack_stray_bytes(ctx: Ctx) -> None:
    """6d: stray NUL and EOLs between frames: the connection must survive."""
    dest = "/queue/" + ctx.q("stray")
    variants = {
        "eols": b"\n\n\r\n\n",
        "nul": b"\0",
        "nuls-and-eols": b"\0\n\0\r\n\0\0\n",
    }
    for name, junk in variants.items():
        with ctx.measure("stray-bytes", name) as r:
            d = ctx.deadline(5)
            c = Conn.open(ctx.host, ctx.port, d)
            try:
                c.send(connect_frame("1.2") + junk, d)
                c.expect("CONNECTED", d)
                c.send(frame("SEND", {"destination": dest, "receipt": "r1"}, b"a") + junk
                       + frame("SEND", {"destination": dest, "receipt": "r2"}, b"b") + junk, d)
                ok1, why1 = wait_receipt(c, "r1", d, keep=True)
                ok2, why2 = wait_receipt(c, "r2", d)
                r.data["receipts"] = [ok1, ok2]
                r.check(ok1 and ok2, f"connection did not survive stray bytes ({why1 or why2})")
            finally:
                c.close()


def _control_bytes(data: bytes) -> list[int]:
    return sorted({b for b in data if (b < 32 and b not in (9, 10)) or b == 127})


def _longest_run(data: bytes, ch: int) -> int:
    best = cur = 0
    for b in data:
        cur = cur + 1 if b == ch else 0
        best = max(best, cur)
    return best


def attack_error_excerpt(ctx: Ctx) -> None:
    """6e: an invalid frame makes an ERROR whose body echoes a short, escaped excerpt."""
    junk = b"\x1b[2J\x07\x01" + b"Z" * 3000
    dest = f"destination:/queue/{ctx.q('err')}\n".encode()
    variants = {
        "no-colon": b"SEND\n" + dest + junk + b"\n\nbody\0",
        "bad-escape": b"SEND\n" + dest + b"x-h:\\q" + junk + b"\n\nbody\0",
        "bad-utf8": b"SEND\n" + dest + b"x-h:\xff\xfe" + junk + b"\n\nbody\0",
        "bad-content-length": b"SEND\n" + dest + b"content-length:12" + junk + b"\n\nbody\0",
        "unknown-command": junk + b"\n" + dest + b"\nbody\0",
        "bad-ack-mode": b"SUBSCRIBE\n" + dest + b"id:1\nack:" + junk + b"\n\n\0",
        "long-line": b"SEND\n" + dest + b"x-h:" + junk * 3 + b"\n\nbody\0",
    }
    for name, payload in variants.items():
        with ctx.measure("error-excerpt", name) as r:
            d = ctx.deadline(5)
            c = ctx.connect()
            try:
                c.send(payload, d)
                c.wait_for(lambda c: c.eof, d)
                err_at = c.buf.find(b"ERROR\n")
                r.check(err_at >= 0, "no ERROR frame")
                if err_at >= 0:
                    raw = bytes(c.buf[err_at:])
                    raw = raw[: raw.find(NUL)] if NUL in raw else raw
                    echo = _longest_run(raw, ord("Z"))
                    ctrl = _control_bytes(raw)
                    try:
                        raw.decode("utf-8")
                        utf8 = True
                    except UnicodeDecodeError:
                        utf8 = False
                    frames, _ = parse_frames(c.buf[err_at:])
                    r.data.update(error_bytes=len(raw), echoed_bytes=echo, control_bytes=ctrl, utf8=utf8,
                                  message=frames[0][1].get("message", "")[:120] if frames else "")
                    r.check(echo <= 100, f"ERROR echoes {echo} bytes of the input (> 100)")
                    r.check(not ctrl, f"ERROR holds raw control bytes {ctrl}")
                    r.check(utf8, "ERROR is not valid UTF-8")
                r.data["closed_by_broker"] = c.eof
                r.check(c.eof, "connection not closed within 5 s after the ERROR")
            finally:
                c.close()


def attack_nack_requeue(ctx: Ctx) -> None:
    """6c: NACK with requeue:False (and other spellings): does the message come back?
    Also: SUBSCRIBE durable:True to a topic: honoured, refused, or silently ignored?"""
    for value in ("False", "false", "0", "no"):
        with ctx.measure("nack-requeue", f"requeue:{value}") as r:
            q = ctx.q(f"nr-{value}")
            dest = "/queue/" + q
            d = ctx.deadline(8)
            c = ctx.connect()
            try:
                c.send(frame("SUBSCRIBE", {"id": "s", "destination": dest, "ack": "client-individual",
                                           "durable": "True", "receipt": "sub"}), d)
                ok, why = wait_receipt(c, "sub", d)
                r.check(ok, f"SUBSCRIBE durable:True refused ({why})")
                if not ok:
                    continue
                c.send(frame("SEND", {"destination": dest, "receipt": "p"}, b"m1"), d)
                c.wait_for(lambda c: b"MESSAGE\n" in c.buf, d)
                frames, used = parse_frames(c.buf)
                del c.buf[:used]
                msgs = [f for f in frames if f[0] == "MESSAGE"]
                if not msgs:
                    r.fail("message never delivered")
                    continue
                ack = msgs[0][1].get("ack") or msgs[0][1].get("message-id")
                c.send(frame("NACK", {"id": ack, "requeue": value, "receipt": "n"}), d)
                c.wait_for(lambda c: b"receipt-id:n\n" in c.buf or b"ERROR\n" in c.buf, d)
                if b"ERROR\n" in c.buf:
                    err = error_of(c)
                    r.data["outcome"] = f"ERROR: {err[1].get('message') if err else '?'}"
                    r.note = "refused explicitly"
                    continue
                c.wait_for(lambda c: b"MESSAGE\n" in c.buf, ctx.deadline(1.5))
                back = b"MESSAGE\n" in c.buf
                r.data["came_back"] = back
                r.data["outcome"] = "requeued (message came back)" if back else "dropped"
                r.check(not back, f"NACK requeue:{value} requeued the message (it came back)")
            finally:
                c.close()
    with ctx.measure("nack-requeue", "durable:True-topic") as r:
        key = f"hostile.{ctx.run}.dt"
        cid = f"hostile-{ctx.run}-dt"
        d = ctx.deadline(8)
        c = ctx.connect(extra=(("client-id", cid),))
        try:
            c.send(frame("SUBSCRIBE", {"id": "dt", "destination": "/topic/" + key, "ack": "client",
                                       "durable": "True", "receipt": "sub"}), d)
            ok, why = wait_receipt(c, "sub", d)
            c.send(frame("DISCONNECT", {"receipt": "bye"}), d)
            c.wait_for(lambda c: c.eof, d)
        finally:
            c.close()
        if not ok:
            r.data["outcome"] = f"refused: {why}"
        else:
            p = ctx.connect()
            p.send(frame("SEND", {"destination": "/topic/" + key, "receipt": "p"}, b"kept?"), d)
            wait_receipt(p, "p", d)
            p.close()
            c = ctx.connect(extra=(("client-id", cid),))
            try:
                c.send(frame("SUBSCRIBE", {"id": "dt", "destination": "/topic/" + key, "ack": "auto",
                                           "durable": "True"}), d)
                got = c.wait_for(lambda c: b"kept?" in c.buf, ctx.deadline(2))
                r.data["message_kept_while_away"] = got
                r.data["outcome"] = "honoured as durable" if got else "silently NOT durable"
                r.check(got, "durable:True accepted but not honoured (message published while away was lost)")
                c.send(frame("UNSUBSCRIBE", {"id": "dt", "durable": "true", "receipt": "u"}), d)
                wait_receipt(c, "u", d)
            finally:
                c.close()


def attack_nack_forever(ctx: Ctx) -> None:
    """6f: a consumer NACKs (requeue) every delivery: how fast, how far does it loop?"""
    seconds = ctx.t(5.0, 3.0)
    with ctx.measure("nack-forever") as r:
        q = ctx.q("nf")
        dest = "/queue/" + q
        c = ctx.connect()
        try:
            d = ctx.deadline(seconds + 10)
            c.send(frame("SUBSCRIBE", {"id": "s", "destination": dest, "ack": "client-individual",
                                       "prefetch-count": "1", "receipt": "sub"}), d)
            wait_receipt(c, "sub", d)
            c.send(frame("SEND", {"destination": dest}, b"poison"), d)
            end = time.monotonic() + seconds
            deliveries = 0
            max_count = 0
            last_delivery = time.monotonic()
            dc_re = re.compile(rb"\nx-delivery-count:(\d+)")
            while time.monotonic() < end and not c.eof:
                try:
                    c._wait_readable(min(end, time.monotonic() + 0.5))
                except WireError:
                    continue
                c.pump()
                frames, used = parse_frames(c.buf)
                del c.buf[:used]
                nacks = []
                for cmd, h, _ in frames:
                    if cmd == "MESSAGE":
                        deliveries += 1
                        last_delivery = time.monotonic()
                        with contextlib.suppress(ValueError):
                            max_count = max(max_count, int(h.get("x-delivery-count", "0")))
                        nacks.append(frame("NACK", {"id": h.get("ack", "")}))
                if nacks:
                    c.send(b"".join(nacks), ctx.deadline(5))
            stopped = time.monotonic() - last_delivery > 1.0
            r.data.update(seconds=seconds, deliveries=deliveries, per_second=round(deliveries / seconds),
                          max_delivery_count=max_count, redelivery_stopped=stopped)
            r.check(stopped, f"redelivered {deliveries} times in {seconds:g} s "
                             f"({deliveries / seconds:.0f}/s, delivery count {max_count}) with no limit")
            del dc_re
        finally:
            c.close()


def attack_sub_unsub(ctx: Ctx) -> None:
    """6g: SUBSCRIBE/UNSUBSCRIBE pairs on distinct queue names: does memory stay?"""
    pairs = ctx.n(20_000, 5_000)
    with ctx.measure("sub-unsub", f"x{pairs}") as r:
        rss0 = ctx.broker_rss()
        c = ctx.connect()
        try:
            d = ctx.deadline(ctx.t(120, 60))
            frames = []
            for i in range(pairs):
                frames.append(frame("SUBSCRIBE", {"id": f"s{i}", "destination": f"/queue/{ctx.q('su')}-{i}"}))
                frames.append(frame("UNSUBSCRIBE", {"id": f"s{i}"}))
            t = time.monotonic()
            send_frames(c, frames, d, batch=2000)
            c.send(frame("SEND", {"destination": "/queue/" + ctx.q("su-end"), "receipt": "end"}, b"e"), d)
            ok, why = wait_receipt(c, "end", d)
            r.data["seconds"] = round(time.monotonic() - t, 2)
            r.check(ok, f"no receipt ({why})")
        finally:
            c.abort()
        time.sleep(1.0)
        growth = ctx.broker_rss() - rss0
        limit = 512 * pairs / MiB
        r.data.update(pairs=pairs, rss_growth_mib=round(growth, 1), bytes_per_pair=int(growth * MiB / pairs),
                      limit_mib=round(limit, 1))
        r.check(growth < limit, f"RSS grew {growth:.1f} MiB after {pairs} pairs "
                                f"(~{int(growth * MiB / pairs)} B per queue name; limit 512 B)")


# =============================================================== 2. NUL injection
def attack_nul_inject(ctx: Ctx) -> None:
    """2: NUL (and escaped EOLs) in a header value must not forge frames at a subscriber."""
    versions = ("1.0", "1.1", "1.2")
    combos = [(a, v) for a in versions for v in versions]
    if ctx.quick:
        combos = [("1.0", "1.2"), ("1.2", "1.2"), ("1.2", "1.0"), ("1.1", "1.1")]

    def payloads(vsub: str, dest: str) -> dict[str, bytes]:
        forged = (b"\0MESSAGE\nsubscription:" + vsub.encode() + b"\nmessage-id:forged-1\n"
                  b"destination:" + dest.encode() + b"\ncontent-length:7\n\n forged\0"
                  b"ERROR\nmessage:forged\n\n\0")
        esc = forged.replace(b"\n", b"\\n").replace(b":", b"\\c")
        head = b"SEND\ndestination:" + dest.encode() + b"\nreceipt:inj\n"
        return {
            # The brief's payload as raw bytes: its EOLs end the header line, the
            # NUL stays inside a header value.
            "raw": head + b"x-inject:a" + forged,
            # Escaped EOLs and colons (1.1/1.2 escapes) around raw NULs.
            "escaped": head + b"x-inject:a" + esc + b"\n\nbody\0",
            # A NUL in a header name.
            "nul-name": head + b"x\0MESSAGE:1\n\nbody\0",
        }

    for kind in ("raw", "escaped", "nul-name"):
        for target in ("queue", "topic"):
            if target == "topic" and kind != "raw":
                continue
            with ctx.measure("nul-inject", f"{kind}/{target}") as r:
                cases = []
                for att_v, vic_v in (combos if target == "queue" else [("1.0", "1.2"), ("1.2", "1.0")]):
                    cases.append(_nul_case(ctx, kind, target, att_v, vic_v, payloads))
                r.data["cases"] = cases
                forged = [c for c in cases if c["forged_frames"]]
                nulhdr = [c for c in cases if c["nul_in_headers"]]
                accepted = [c for c in cases if not c["attacker_refused"]]
                r.data.update(combos=len(cases), forged_cases=len(forged), nul_delivered_cases=len(nulhdr),
                              accepted_cases=len(accepted))
                r.check(not forged, f"{len(forged)}/{len(cases)} victims saw forged frames "
                                    f"(e.g. attacker {forged[0]['attacker']} -> victim {forged[0]['victim']}: "
                                    f"{forged[0]['nul_split_commands']})" if forged else "")
                r.check(not nulhdr, f"{len(nulhdr)}/{len(cases)} victims got a NUL inside a header")
                r.check(not accepted, f"{len(accepted)}/{len(cases)} injecting SENDs were accepted (RECEIPT, no ERROR)")


def _nul_case(ctx: Ctx, kind: str, target: str, att_v: str, vic_v: str,
              payloads: Callable[[str, str], dict[str, bytes]]) -> dict[str, Any]:
    name = ctx.q(f"victim-{kind}-{att_v}-{vic_v}")
    dest = f"/queue/{name}" if target == "queue" else f"/topic/hostile.{ctx.run}.victim.{kind}.{att_v}.{vic_v}"
    d = ctx.deadline(6)
    victim = ctx.connect(version=vic_v)
    attacker = ctx.connect(version=att_v)
    try:
        victim.send(frame("SUBSCRIBE", {"id": "vsub", "destination": dest, "ack": "auto", "receipt": "vs"},
                          version=vic_v), d)
        wait_receipt(victim, "vs", d)
        victim.buf.clear()
        attacker.send(payloads("vsub", dest)[kind], d)
        attacker.wait_for(lambda c: b"receipt-id:inj" in c.buf or b"ERROR\n" in c.buf or c.eof, d)
        att = bytes(attacker.buf)
        receipt_at = att.find(b"receipt-id:inj")
        error_at = att.find(b"ERROR\n")
        refused = error_at >= 0 and (receipt_at < 0 or error_at < receipt_at)
        victim.wait_for(lambda c: NUL in c.buf, ctx.deadline(0.3 if refused else 1.0))
        time.sleep(0.1)
        victim.pump()
        raw = bytes(victim.buf)
        spec, _ = parse_frames(raw)
        naive = nul_split_frames(raw)
        spec_cmds = [f[0] for f in spec]
        naive_cmds = [c for c, _ in naive]
        forged = max(0, len(naive) - len(spec)) + sum(1 for c in spec_cmds if c != "MESSAGE") \
            + sum(1 for _, piece in naive if b"forged" in piece and not piece.startswith(b"MESSAGE\nsubscription:vsub\nmessage-id:"))
        nul_hdr = any("\0" in k or "\0" in v for _, h, _ in spec for k, v in h.items())
        return {"attacker": att_v, "victim": vic_v, "attacker_refused": refused,
                "attacker_error": (parse_frames(att[error_at:])[0][0][1].get("message", "")
                                   if error_at >= 0 and parse_frames(att[error_at:])[0] else None),
                "spec_commands": spec_cmds, "nul_split_commands": naive_cmds[:6],
                "forged_frames": forged, "nul_in_headers": nul_hdr}
    finally:
        victim.close()
        attacker.close()


# =============================================================== 3 + 6a. close paths
@dataclasses.dataclass
class CloseProbe:
    group: str  # result variant, e.g. "tls/error"
    conn: Conn
    due: float  # monotonic time at which the broker should close it
    reference: float  # time the close is measured from
    expect: str = ""  # a frame expected before the close ("ERROR", "RECEIPT")


def attack_close_paths(ctx: Ctx, which: set[str]) -> None:
    """3 (TLS close paths, and the same over plain TCP) and 6a (half a frame, then silence).

    All probes run concurrently; each must be closed by the broker within
    ``--close-deadline`` seconds of the moment its close is due."""
    slack = ctx.args.close_deadline
    conn_timeout = float(ctx.setting("connect_timeout", 30.0))
    hb_recv = int(ctx.setting("heartbeat_receive_ms", 10000))
    grace = float(ctx.setting("heartbeat_grace", 1.5))
    idle = ctx.setting("idle_timeout")
    frame_to = ctx.setting("frame_timeout")
    n_raw = ctx.n(400, 100)
    probes: list[CloseProbe] = []
    notes: dict[str, str] = {}
    errors: dict[str, list[str]] = {}
    transports = []
    if "tls-close" in which:
        if ctx.tls_port:
            transports.append("tls")
        transports.append("tcp")
    t_start = time.monotonic()

    def add(group: str, fn: Callable[[], CloseProbe | None]) -> None:
        try:
            p = fn()
            if p is not None:
                probes.append(p)
        except WireError as e:
            errors.setdefault(group, []).append(str(e))

    for tr in transports:
        tls = tr == "tls"
        port = ctx.tls_port if tls else ctx.port
        ctxt = ctx.tls if tls else None

        def bad_frame(tls=tls) -> CloseProbe:
            c = ctx.connect(tls=tls)
            c.send(b"BOGUS\n\n\0", ctx.deadline(5))
            return CloseProbe(f"{'tls' if tls else 'tcp'}/error", c, time.monotonic(), time.monotonic(), "ERROR")

        def disconnect(tls=tls) -> CloseProbe:
            c = ctx.connect(tls=tls)
            c.send(frame("DISCONNECT", {"receipt": "bye"}), ctx.deadline(5))
            return CloseProbe(f"{'tls' if tls else 'tcp'}/disconnect", c, time.monotonic(), time.monotonic(),
                              "RECEIPT")

        def no_connect(tls=tls, port=port, ctxt=ctxt) -> CloseProbe:
            c = Conn.open(ctx.host, port, ctx.deadline(10), tls=ctxt)
            return CloseProbe(f"{'tls' if tls else 'tcp'}/connect-timeout", c, c.opened_at + conn_timeout,
                              c.opened_at, "ERROR")

        def hb_timeout(tls=tls) -> CloseProbe:
            c = ctx.connect(tls=tls, heart_beat="1000,0")
            interval = max(hb_recv, 1000) / 1000.0
            due = time.monotonic() + interval * grace + interval / 2
            return CloseProbe(f"{'tls' if tls else 'tcp'}/heartbeat-timeout", c, due, time.monotonic(), "ERROR")

        def hb_silent(tls=tls) -> CloseProbe:
            c = ctx.connect(tls=tls, heart_beat="0,1000")
            due = time.monotonic() + (float(idle) if idle else 1e9)
            return CloseProbe(f"{'tls' if tls else 'tcp'}/hb-0,1000-silent", c, due, time.monotonic())

        for fn in (bad_frame, disconnect, no_connect, hb_timeout, hb_silent):
            add(fn.__name__, fn)
        if tls:
            hello = client_hello(ctx.tls)
            conns, errs = open_many(ctx.host, port, n_raw // 2, ctx.deadline(20))
            errors.setdefault("tls/no-clienthello", []).extend(errs)
            for c in conns:
                probes.append(CloseProbe("tls/no-clienthello", c, c.opened_at, c.opened_at))
            conns, errs = open_many(ctx.host, port, n_raw // 4, ctx.deadline(20))
            errors.setdefault("tls/half-clienthello", []).extend(errs)
            for c in conns:
                c.send_raw(hello[: len(hello) // 2], ctx.deadline(5))
                probes.append(CloseProbe("tls/half-clienthello", c, c.opened_at, c.opened_at))
            conns, errs = open_many(ctx.host, port, n_raw // 4, ctx.deadline(20))
            errors.setdefault("tls/clienthello-then-stall", []).extend(errs)
            for c in conns:
                c.send_raw(hello, ctx.deadline(5))
                probes.append(CloseProbe("tls/clienthello-then-stall", c, c.opened_at, c.opened_at))
        else:
            conns, errs = open_many(ctx.host, port, n_raw // 2, ctx.deadline(20))
            errors.setdefault("tcp/silent-sockets", []).extend(errs)
            for c in conns:
                probes.append(CloseProbe("tcp/silent-sockets", c, c.opened_at + conn_timeout, c.opened_at))
    if "half-frame" in which:
        half_due = min([float(x) for x in (idle, frame_to) if x] or [1e9])
        for name, data in (("half-header", b"SEND\ndestination:/queue/" + ctx.q("half").encode()),
                           ("half-body", b"SEND\ndestination:/queue/" + ctx.q("half").encode()
                            + b"\ncontent-length:100\n\n0123456789")):
            def half(data=data, name=name) -> CloseProbe:
                c = ctx.connect(heart_beat="0,0")
                c.send(data, ctx.deadline(5))
                return CloseProbe(f"half-frame/{name}", c, time.monotonic() + half_due, time.monotonic())
            add(name, half)
        notes["half-frame"] = (f"server idle_timeout={idle} frame_timeout={frame_to}"
                               if (idle or frame_to) else "this broker has no idle/frame timeout setting")
    if not probes:
        return
    cap = max(ctx.args.idle_deadline if not ctx.quick else min(ctx.args.idle_deadline, 20.0), slack)

    def deadline_of(p: CloseProbe) -> float:
        """Due time + slack; a close due later than ``cap`` (or never) is watched for ``cap`` s."""
        due_in = p.due - p.reference
        return p.due + slack if due_in <= cap else p.reference + cap

    # One window for all: until every probe is closed or past its deadline.
    groups: dict[str, list[CloseProbe]] = {}
    for p in probes:
        groups.setdefault(p.group, []).append(p)
    t0 = now_ns() - int((time.monotonic() - t_start) * 1e9)
    watch([p.conn for p in probes], max(deadline_of(p) for p in probes), drain=False)
    t1 = now_ns()
    for group, ps in groups.items():
        attack = "half-frame" if group.startswith("half-frame/") else "tls-close"
        with ctx.measure(attack, group.split("/", 1)[1] if attack == "half-frame" else group,
                         window=(t0, t1)) as r:
            in_time = [p for p in ps if p.conn.eof and p.conn.eof_at is not None
                       and p.conn.eof_at <= deadline_of(p)]
            still_open = [p for p in ps if not p.conn.eof]
            late = [p for p in ps if p.conn.eof and p not in in_time]
            end = t1 / 1e9 - (now_ns() / 1e9 - time.monotonic())  # the window's end, as monotonic seconds
            open_for = [round((p.conn.eof_at or end) - p.reference, 2) for p in ps]
            due = ps[0].due - ps[0].reference
            r.data.update(connections=len(ps), closed_in_time=len(in_time), still_open=len(still_open),
                          closed_late=len(late), close_due_after_s=round(due, 1) if due < 1e6 else None,
                          deadline_s=round(deadline_of(ps[0]) - ps[0].reference, 1),
                          open_for_s_max=max(open_for), open_for_s_median=statistics.median(open_for),
                          connect_errors=len(errors.get(group, [])))
            if ps[0].expect:
                token = (ps[0].expect + "\n").encode()
                r.data["expected_frame"] = ps[0].expect
                r.data["expected_frame_seen"] = sum(1 for p in ps if token in p.conn.buf)
            if group.startswith("tls/"):
                r.data["tls_close_notify"] = sum(1 for p in ps if p.conn.tls_eof)
            if attack == "half-frame":
                r.note = notes.get("half-frame", "")
            if still_open and not late and cap < due < 1e6:
                # The broker's own timeout is longer than we are willing to wait.
                r.status = "INFO"
                r.reasons.append(f"{len(still_open)}/{len(ps)} still open after {max(open_for):.0f} s; the close is "
                                 f"due after {due:.0f} s (beyond --idle-deadline)")
            else:
                r.check(not still_open and not late,
                        f"{len(still_open) + len(late)}/{len(ps)} not closed by the broker within "
                        f"{r.data['deadline_s']:g} s (open for {max(open_for):.1f} s at the end)"
                        + ("; no timeout would close it" if due >= 1e6 else ""))
    close_all(p.conn for p in probes)
    for group, errs in errors.items():
        if errs:
            log(f"  {group}: {len(errs)} connect errors, e.g. {errs[0]}")


# =============================================================== 4. memory
def _flood(ctx: Ctx, dest: str, seconds: float, r: Result, body_size: int = 1024) -> dict[str, Any]:
    """Publish as fast as possible for ``seconds``; every 1,000th SEND and the last one receipted."""
    rss_limit = ctx.args.rss_limit
    c = ctx.connect()
    pad = b"." * (body_size - 13)
    batch_n = 200
    sent = 0
    receipted_ids: list[int] = []
    pending: dict[str, int] = {}
    rss_hit = False
    errors: list[str] = []
    blocked_s = 0.0
    t_end = time.monotonic() + seconds
    next_rss = 0.0
    try:
        while time.monotonic() < t_end and not c.eof:
            parts = []
            for _ in range(batch_n):
                i = sent
                sent += 1
                if i % 1000 == 999:
                    rid = f"f{i}"
                    pending[rid] = i
                    parts.append(frame("SEND", {"destination": dest, "receipt": rid}, b"R%012d" % i + pad))
                else:
                    parts.append(frame("SEND", {"destination": dest}, b"U%012d" % i + pad))
            data = b"".join(parts)
            view = memoryview(data)
            t_w = time.monotonic()
            while view and time.monotonic() < t_end:
                n = c.try_send(view)
                view = view[n:]
                if view:
                    with contextlib.suppress(WireError):
                        c._wait_readable(min(t_end, time.monotonic() + 0.05))
                    c.pump()
                if c.eof:
                    break
            blocked_s += max(0.0, time.monotonic() - t_w - 0.001) if view else 0.0
            if view:  # time is up in the middle of a batch: finish it (bounded) so frames are whole
                with contextlib.suppress(WireError):
                    c.send(bytes(view), ctx.deadline(10))
            c.pump()
            _collect_receipts(c, pending, receipted_ids, errors)
            if time.monotonic() > next_rss:
                next_rss = time.monotonic() + 0.25
                if ctx.broker_rss() > rss_limit:
                    rss_hit = True
                    break
        if not c.eof:
            last = sent
            sent += 1
            with contextlib.suppress(WireError):  # refused and closed meanwhile
                c.send(frame("SEND", {"destination": dest, "receipt": "flast"}, b"R%012d" % last + pad),
                       ctx.deadline(30))
                pending["flast"] = last
        d = ctx.deadline(ctx.t(60, 30))
        while pending and time.monotonic() < d and not c.eof:
            with contextlib.suppress(WireError):
                c._wait_readable(min(d, time.monotonic() + 0.5))
            c.pump()
            _collect_receipts(c, pending, receipted_ids, errors)
        err = error_of(c)
        if err is None and errors:
            err = ("ERROR", {"message": errors[0]}, b"")
        alarm = memory_alarm_on(ctx) if pending and not err else None
    finally:
        c.close()
    return {"sent": sent, "receipted": len(receipted_ids), "receipts_missing": len(pending),
            "memory_alarm_on": alarm,
            "receipted_ids": receipted_ids, "rss_limit_hit": rss_hit, "publisher_error":
            err[1].get("message") if err else None, "msgs_per_s": round(sent / seconds)}


def _collect_receipts(c: Conn, pending: dict[str, int], got: list[int],
                      errors: list[str] | None = None) -> None:
    frames, used = parse_frames(c.buf)
    del c.buf[:used]
    for cmd, h, _ in frames:
        if cmd == "ERROR" and errors is not None:
            errors.append(h.get("message", ""))
        elif cmd == "RECEIPT":
            i = pending.pop(h.get("receipt-id", ""), None)
            if i is not None:
                got.append(i)


def _drain(ctx: Ctx, c: Conn, expect: int, receipted: list[int], seconds: float) -> dict[str, Any]:
    """Count deliveries on a subscribed connection until ``expect`` or silence/deadline."""
    found: set[int] = set()
    rid_re = re.compile(rb"\n\nR(\d{12})")
    delivered = 0
    d = ctx.deadline(seconds)
    quiet = time.monotonic()
    buf = bytearray()
    while delivered < expect and time.monotonic() < d and not c.eof:
        try:
            c._wait_readable(min(d, time.monotonic() + 0.5))
        except WireError:
            if time.monotonic() - quiet > 5:
                break
            continue
        c.pump()
        if c.buf:
            quiet = time.monotonic()
            buf += c.buf
            c.buf.clear()
            cut = buf.rfind(NUL)
            if cut >= 0:
                chunk = bytes(buf[: cut + 1])
                del buf[: cut + 1]
                delivered += chunk.count(b"MESSAGE\n")
                found.update(int(m) for m in rid_re.findall(chunk))
    lost = sorted(set(receipted) - found)
    return {"delivered": delivered, "receipted_delivered": len(set(receipted) & found),
            "receipted_lost": len(lost), "lost_example": lost[:5]}


def attack_flood(ctx: Ctx) -> None:
    """4: flood a queue nobody consumes; then drain it: every receipted message must be there."""
    seconds = ctx.t(ctx.args.flood_seconds, min(5.0, ctx.args.flood_seconds))
    q = ctx.q("flood")
    with ctx.measure("flood", "queue") as r:
        f = _flood(ctx, "/queue/" + q, seconds, r)
        peak = ctx.monitor_window(r.t0, now_ns())[0]
        r.phase("flood_phase", r.t0)
        t_drain = now_ns()
        c = ctx.connect()
        try:
            c.send(frame("SUBSCRIBE", {"id": "d", "destination": "/queue/" + q, "ack": "auto"}), ctx.deadline(5))
            dr = _drain(ctx, c, f["sent"], f["receipted_ids"], ctx.t(120, 45))
        finally:
            c.close()
        r.phase("drain_phase", t_drain)
        _flood_report(ctx, r, f, dr, peak, seconds)


def _flood_report(ctx: Ctx, r: Result, f: dict[str, Any], dr: dict[str, Any], peak: float, seconds: float) -> None:
    ids = f.pop("receipted_ids")
    r.data.update(f)
    r.data.update(dr)
    r.data["flood_seconds"] = seconds
    r.data["peak_rss_mib_during_flood"] = round(peak, 1)
    r.data["receipted_ids"] = len(ids)
    mark = ctx.args.memory_mark
    if mark:
        r.data["memory_mark_mib"] = mark
        r.check(peak <= mark * 1.1, f"peak RSS {peak:.0f} MiB > memory mark {mark} MiB (+10%)")
    r.check(not f["rss_limit_hit"], f"flood stopped at the runner's RSS safety limit ({ctx.args.rss_limit} MiB): "
                                    "no back-pressure")
    r.check(dr["receipted_lost"] == 0, f"{dr['receipted_lost']} receipted messages never delivered")
    if f["publisher_error"]:
        # The broker refused the flood (a bounded queue's reject-publish): the
        # SENDs after the refusal were never promised, so their receipts are
        # not owed; what was receipted must still all be delivered.
        r.note = f"publisher refused: {f['publisher_error']}"[:80]
    elif f.get("memory_alarm_on"):
        # The publisher is blocked by the memory alarm (not read): the frames
        # it sent after that were never read, so no receipt is owed yet.
        r.note = f"publisher blocked by the memory alarm; {f['receipts_missing']} receipts wait"[:80]
    else:
        r.check(f["receipts_missing"] == 0, f"{f['receipts_missing']} receipts never came")


def attack_durable_flood(ctx: Ctx) -> None:
    """4 (variant): a durable topic subscription whose client is gone, then a topic flood."""
    seconds = ctx.t(ctx.args.flood_seconds, min(5.0, ctx.args.flood_seconds))
    key = f"hostile.{ctx.run}.dflood"
    cid = f"hostile-{ctx.run}-df"
    with ctx.measure("durable-flood", "topic") as r:
        d = ctx.deadline(10)
        c = ctx.connect(extra=(("client-id", cid),))
        sub = {"id": "df", "destination": "/topic/" + key, "ack": "client", "durable": "true",
               "activemq.subscriptionName": "df", "prefetch-count": "1000"}
        c.send(frame("SUBSCRIBE", {**sub, "receipt": "s"}), d)
        ok, why = wait_receipt(c, "s", d)
        c.send(frame("DISCONNECT", {"receipt": "bye"}), d)
        c.wait_for(lambda c: c.eof, d)
        c.close()
        r.check(ok, f"durable SUBSCRIBE refused: {why}")
        t_flood = now_ns()
        f = _flood(ctx, "/topic/" + key, seconds, r)
        peak = ctx.monitor_window(r.t0, now_ns())[0]
        r.phase("flood_phase", t_flood)
        t_drain = now_ns()
        c = ctx.connect(extra=(("client-id", cid),))
        try:
            c.send(frame("SUBSCRIBE", {**sub, "ack": "auto"}), ctx.deadline(5))
            dr = _drain(ctx, c, f["sent"], f["receipted_ids"], ctx.t(120, 45))
            r.phase("drain_phase", t_drain)
            c.send(frame("UNSUBSCRIBE", {"id": "df", "durable": "true", "activemq.subscriptionName": "df",
                                         "receipt": "u"}), ctx.deadline(5))
            wait_receipt(c, "u", ctx.deadline(10))
        finally:
            c.close()
        _flood_report(ctx, r, f, dr, peak, seconds)


def attack_partial_bodies(ctx: Ctx) -> None:
    """4 (variant): many connections each send most of a 16 MiB body, then stall."""
    n = ctx.n(200, 50)
    each = int((ctx.args.partial_mib if not ctx.quick else min(1.0, ctx.args.partial_mib)) * MiB)
    hold = ctx.t(5.0, 3.0)
    with ctx.measure("partial-bodies", f"{n}x{each // 1024}KiB") as r:
        rss0 = ctx.broker_rss()
        conns, errs = open_many(ctx.host, ctx.port, n, ctx.deadline(20))
        try:
            d = ctx.deadline(20)
            live = []
            for c in conns:
                try:
                    c.send(connect_frame("1.2") + frame("SEND", {"destination": "/queue/" + ctx.q("partial"),
                                                                 "content-length": str(16 * MiB)})[:-1], d)
                    live.append(c)
                except WireError:
                    pass
            chunk = b"B" * 65536
            sent = {id(c): 0 for c in live}
            d = ctx.deadline(ctx.t(90, 40))
            active = list(live)
            while active and time.monotonic() < d:
                progress = False
                for c in list(active):
                    left = each - sent[id(c)]
                    if left <= 0 or c.eof:
                        active.remove(c)
                        continue
                    k = c.try_send(chunk[: min(left, len(chunk))])
                    if k:
                        sent[id(c)] += k
                        progress = True
                    c.pump()
                if not progress:
                    time.sleep(0.005)
            total = sum(sent.values())
            t_hold = time.monotonic()
            watch(live, ctx.deadline(hold), drain=False)
            peak = ctx.monitor_window(r.t0, now_ns())[0]
            closed = sum(1 for c in live if c.eof)
            errors = sum(1 for c in live if b"ERROR\n" in c.buf[:200])
            r.data.update(connections=len(conns), connect_errors=len(errs), bytes_sent_mib=round(total / MiB, 1),
                          per_connection_mib=round(each / MiB, 2), closed_by_broker=closed,
                          errors_seen=errors, rss_growth_mib=round(peak - rss0, 1),
                          hold_s=round(time.monotonic() - t_hold, 1))
        finally:
            close_all(conns)
        time.sleep(1.0)
        after = ctx.broker_rss()
        r.data["rss_after_close_mib"] = round(after, 1)
        mark = ctx.args.memory_mark or 512
        r.check(peak - rss0 <= mark, f"RSS grew {peak - rss0:.0f} MiB holding {total / MiB:.0f} MiB of unfinished "
                                     f"frames (limit {mark} MiB)")


def attack_cache_bloat(ctx: Ctx) -> None:
    """Found while writing this runner: caches keep what a client sent after
    the messages are gone. Every SEND goes to a topic nobody listens to, so
    nothing is stored; the connections then stay open, idle.

    * ``header-blocks``: per connection, 256 SENDs each with its own ~56 KiB
      header block (a session caches MESSAGE header blocks by their raw
      header bytes, 256 entries).
    * ``destinations``: per connection, 1,000 SENDs to distinct ~8 KiB topic
      destinations (a session's destination cache holds 1,000; the topic
      exchange's route cache, shared, 10,000 keys).
    """
    filler = "h" * 7900
    for variant in ("header-blocks", "destinations"):
        n = ctx.n(40, 10)
        with ctx.measure("cache-bloat", f"{variant}-x{n}") as r:
            rss0 = ctx.broker_rss()
            conns = []
            sent = 0
            refused = None
            try:
                d = ctx.deadline(ctx.t(120, 60))
                for k in range(n):
                    if time.monotonic() > d:
                        break
                    c = ctx.connect()
                    conns.append(c)
                    frames = []
                    if variant == "header-blocks":
                        for i in range(256):
                            h = [("destination", f"/topic/hostile.{ctx.run}.nobody")]
                            h += [(f"x-{j}", f"{k}-{i}-{filler}") for j in range(7)]
                            frames.append(frame("SEND", h, b"x"))
                    else:
                        for i in range(1000):
                            frames.append(frame("SEND", {"destination": f"/topic/hostile.{ctx.run}.{filler}.{k}.{i}"},
                                                b"x"))
                    frames.append(frame("SEND", {"destination": "/queue/" + ctx.q("cb"), "receipt": "e"}, b"x"))
                    try:
                        send_frames(c, frames, d, batch=64)
                        sent += sum(len(f) for f in frames)
                        ok, why = wait_receipt(c, "e", d)
                    except WireError as e:
                        ok, why = False, str(e)
                    if not ok:
                        err = error_of(c)
                        refused = f"ERROR {err[1].get('message', '')}" if err else why
                        break
                time.sleep(1.0)
                held = ctx.broker_rss() - rss0
                r.data.update(connections=len(conns), bytes_sent_mib=round(sent / MiB, 1),
                              rss_growth_open_mib=round(held, 1),
                              per_connection_mib=round(held / max(1, len(conns)), 2), refused=refused)
            finally:
                close_all(conns)
            time.sleep(1.0)
            r.data["rss_growth_after_close_mib"] = round(ctx.broker_rss() - rss0, 1)
            if refused:
                r.note = f"refused: {refused}"[:80]
            r.check(held <= max(8.0, len(conns) * 1.0),
                    f"RSS grew {held:.0f} MiB ({held / max(1, len(conns)):.1f} MiB per idle connection) "
                    "though no message was stored")


def attack_sub_id_bloat(ctx: Ctx) -> None:
    """Found while writing this runner: a subscription id is free-form and
    kept (and pre-encoded into the MESSAGE prefix) per subscription, so one
    connection holding the most subscriptions it may, each with an ~8 KiB
    id, pins memory without a single message."""
    n = ctx.n(10_000, 2_000)
    with ctx.measure("sub-id-bloat", f"x{n}") as r:
        rss0 = ctx.broker_rss()
        c = ctx.connect()
        try:
            d = ctx.deadline(ctx.t(90, 45))
            pad = "i" * 8000
            frames = [frame("SUBSCRIBE", {"id": f"{pad}{i}", "destination": f"/topic/hostile.{ctx.run}.sid.{i}"})
                      for i in range(n)]
            try:
                send_frames(c, frames, d, batch=200)
                c.send(frame("SEND", {"destination": "/queue/" + ctx.q("sid"), "receipt": "e"}, b"x"), d)
                ok, why = wait_receipt(c, "e", d)
            except WireError as e:
                ok, why = False, refused_while_sending(c, e)
                r.note = f"refused: {why}"[:80]
            time.sleep(0.5)
            held = ctx.broker_rss() - rss0
            r.data.update(subscriptions=n, accepted_all=ok, outcome=why or "all accepted",
                          rss_growth_mib=round(held, 1), bytes_per_subscription=int(held * MiB / n))
        finally:
            c.abort()
        time.sleep(1.0)
        r.data["rss_growth_after_close_mib"] = round(ctx.broker_rss() - rss0, 1)
        r.check(held * MiB / n <= 4096, f"one connection pins {held:.0f} MiB with {n} subscriptions of 8 KiB "
                                         f"ids ({int(held * MiB / n)} B each; limit 4 KiB each)")


def attack_slow_fanout(ctx: Ctx) -> None:
    """Found while writing this runner: one connection holds many live topic
    subscriptions matching one key and stops reading; every message anyone
    publishes is then appended to each subscription's backlog (bounded per
    subscription by stomp.topic_backlog, not per connection)."""
    subs = ctx.n(5_000, 2_000)
    msgs = ctx.n(5_000, 2_000)
    with ctx.measure("slow-fanout", f"{subs}subs-x{msgs}msgs") as r:
        rss0 = ctx.broker_rss()
        key = f"hostile.{ctx.run}.fan"
        slow = ctx.connect(rcvbuf=4096)
        try:
            d = ctx.deadline(ctx.t(90, 45))
            frames = [frame("SUBSCRIBE", {"id": f"f{i}", "destination": f"/topic/{key}.#"}) for i in range(subs)]
            send_frames(slow, frames, d, batch=2000)
            slow.send(frame("SEND", {"destination": "/queue/" + ctx.q("fan"), "receipt": "e"}, b"x"), d)
            ok, why = wait_receipt(slow, "e", d)
            r.check(ok, f"subscriptions refused: {why}")
            # From now on the slow client reads nothing.
            t = time.monotonic()
            t_ns = now_ns()
            pub_ok = publish(ctx, f"/topic/{key}.x", msgs, body_size=1024, seconds=ctx.t(90, 45))
            r.phase("publish_phase", t_ns)
            pub_s = time.monotonic() - t
            time.sleep(0.5)
            held = ctx.broker_rss() - rss0
            r.data.update(subscriptions=subs, published=msgs, publish_ok=pub_ok, publish_s=round(pub_s, 2),
                          published_mib=round(msgs / 1024, 1), rss_growth_mib=round(held, 1),
                          amplification=round(held / max(0.001, msgs / 1024), 1))
            r.check(pub_ok, "the publisher did not get its receipt")
        finally:
            slow.abort()
        time.sleep(1.0)
        r.data["rss_growth_after_close_mib"] = round(ctx.broker_rss() - rss0, 1)
        published = msgs / 1024
        r.check(held <= max(16.0, 4 * published), f"RSS grew {held:.0f} MiB for {published:.1f} MiB published to "
                                                  f"one stalled connection with {subs} subscriptions "
                                                  f"({held / published:.0f}x; limit 4x or 16 MiB)")


def attack_transactions(ctx: Ctx) -> None:
    """4 (variant): 100k BEGINs without COMMIT on one connection; and one huge open transaction."""
    n = ctx.n(100_000, 20_000)
    with ctx.measure("transactions", f"begin-x{n}") as r:
        rss0 = ctx.broker_rss()
        c = ctx.connect()
        try:
            d = ctx.deadline(ctx.t(90, 45))
            frames = [frame("BEGIN", {"transaction": f"t{i}"}) for i in range(n - 1)]
            frames.append(frame("BEGIN", {"transaction": f"t{n - 1}", "receipt": "end"}))
            t = time.monotonic()
            send_frames(c, frames, d, batch=5000)
            ok, why = wait_receipt(c, "end", d)
            r.data["seconds"] = round(time.monotonic() - t, 2)
            peak = ctx.broker_rss()
            r.data.update(transactions=n, accepted_all=ok, outcome=why or "all accepted",
                          rss_growth_mib=round(peak - rss0, 1))
            r.check(not ok and "ERROR" in why, f"{n} open transactions accepted on one connection "
                                               f"(+{peak - rss0:.0f} MiB), no limit")
        finally:
            c.abort()
    # Above the fixed broker's default caps (10,000 frames, 64 MiB) in both modes.
    n = ctx.n(20_000, 12_000)
    kib = 4 if not ctx.quick else 6
    with ctx.measure("transactions", f"held-sends-x{n}x{kib}KiB") as r:
        rss0 = ctx.broker_rss()
        c = ctx.connect()
        try:
            d = ctx.deadline(ctx.t(90, 45))
            body = b"T" * (kib * 1024)
            frames = [frame("BEGIN", {"transaction": "big"})]
            frames += [frame("SEND", {"destination": "/queue/" + ctx.q("tx"), "transaction": "big"}, body)
                       for _ in range(n - 1)]
            frames.append(frame("SEND", {"destination": "/queue/" + ctx.q("tx"), "transaction": "big",
                                         "receipt": "end"}, body))
            try:
                send_frames(c, frames, d, batch=1000)
                ok, why = wait_receipt(c, "end", d)
            except WireError as e:
                ok, why = False, refused_while_sending(c, e)
            peak = ctx.broker_rss()
            r.data.update(frames=n, accepted_all=ok, outcome=why or "all held",
                          rss_growth_mib=round(peak - rss0, 1))
            r.check(not ok and "ERROR" in why, f"{n} SENDs ({n * kib // 1024} MiB) held in one open transaction "
                                               f"(+{peak - rss0:.0f} MiB), no limit")
        finally:
            c.abort()


# =============================================================== 5. quadratic paths
def attack_fanout_subs(ctx: Ctx) -> None:
    """5: 40k ack:client subscriptions to a fanout exchange on one connection, then UNSUBSCRIBE all."""
    n = ctx.n(40_000, 10_000)
    with ctx.measure("fanout-subs", f"x{n}") as r:
        c = ctx.connect()
        try:
            d = ctx.deadline(ctx.phase())
            frames = [frame("SUBSCRIBE", {"id": f"k{i}", "destination": f"/exchange/amq.fanout/k{i}",
                                          "ack": "client"}) for i in range(n)]
            t = time.monotonic()
            send_frames(c, frames, d, batch=2000)
            c.send(frame("SEND", {"destination": "/queue/" + ctx.q("fs"), "receipt": "subs"}, b"x"), d)
            ok, why = wait_receipt(c, "subs", d)
            r.data["subscribe_s"] = round(time.monotonic() - t, 2)
            r.data["subscribe_outcome"] = why or "ok"
            r.phase("subscribe_phase", r.t0)
            if ok:
                frames = [frame("UNSUBSCRIBE", {"id": f"k{i}"}) for i in range(n)]
                t = time.monotonic()
                t_ns = now_ns()
                d = ctx.deadline(ctx.phase())
                send_frames(c, frames, d, batch=2000)
                c.send(frame("SEND", {"destination": "/queue/" + ctx.q("fs"), "receipt": "unsubs"}, b"x"), d)
                ok2, why2 = wait_receipt(c, "unsubs", d)
                r.data["unsubscribe_s"] = round(time.monotonic() - t, 2)
                r.data["unsubscribe_outcome"] = why2 or "ok"
                r.phase("unsubscribe_phase", t_ns)
                r.check(ok2, f"UNSUBSCRIBE phase did not finish within {ctx.phase():g} s: {why2}")
            else:
                r.note = "subscriptions refused (a limit)" if "ERROR" in why else ""
        finally:
            c.abort()


def _collect_acks(ctx: Ctx, c: Conn, n: int, seconds: float) -> list[bytes]:
    acks: list[bytes] = []
    d = ctx.deadline(seconds)
    tail = b""
    while len(acks) < n and time.monotonic() < d and not c.eof:
        with contextlib.suppress(WireError):
            c._wait_readable(min(d, time.monotonic() + 0.5))
        c.pump()
        if c.buf:
            data = tail + bytes(c.buf)
            c.buf.clear()
            cut = data.rfind(NUL)
            acks.extend(ACK_RE.findall(data[: cut + 1]))
            tail = data[cut + 1:]
    return acks


def attack_cumulative_ack(ctx: Ctx) -> None:
    """5: 100k messages on an ack:client subscription, then 100k cumulative ACKs one by one."""
    n = ctx.n(100_000, 20_000)
    with ctx.measure("cumulative-ack", f"x{n}") as r:
        q = ctx.q("cack")
        r.check(publish(ctx, "/queue/" + q, n, seconds=ctx.t(90, 45)), "could not fill the queue")
        c = ctx.connect()
        try:
            c.send(frame("SUBSCRIBE", {"id": "s", "destination": "/queue/" + q, "ack": "client",
                                       "prefetch-count": str(n)}), ctx.deadline(5))
            acks = _collect_acks(ctx, c, n, ctx.t(90, 45))
            r.data["received"] = len(acks)
            d = ctx.deadline(ctx.phase())
            t = time.monotonic()
            t_ns = now_ns()
            frames = [b"ACK\nid:%s\n\n\0" % a for a in acks[:-1]]
            if acks:
                frames.append(b"ACK\nid:%s\nreceipt:acked\n\n\0" % acks[-1])
            send_frames(c, frames, d, batch=2000)
            ok, why = wait_receipt(c, "acked", d)
            r.data["ack_phase_s"] = round(time.monotonic() - t, 2)
            r.phase("ack_phase", t_ns)
            r.data["acks_per_s"] = round(len(acks) / max(1e-3, time.monotonic() - t))
            r.data["ack_outcome"] = why or "ok"
            r.check(ok, f"ACK phase did not finish: {why}")
        finally:
            c.abort()


def attack_nack_paused(ctx: Ctx) -> None:
    """5: a paused consumer (client-individual, prefetch 60000, stops reading) NACKs 60k messages."""
    n = ctx.n(60_000, 20_000)
    with ctx.measure("nack-paused", f"x{n}") as r:
        q = ctx.q("np")
        r.check(publish(ctx, "/queue/" + q, n, body_size=512, seconds=ctx.t(90, 45)), "could not fill the queue")
        # A small receive buffer: once it stops reading, the broker's writes to it back up
        # at once (its transport pauses the session) instead of vanishing into the kernel.
        c = ctx.connect(rcvbuf=8192)
        try:
            c.send(frame("SUBSCRIBE", {"id": "s", "destination": "/queue/" + q, "ack": "client-individual",
                                       "prefetch-count": str(n)}), ctx.deadline(5))
            acks = _collect_acks(ctx, c, n, ctx.t(90, 45))
            r.data["received"] = len(acks)
            # From here on the consumer does not read: NACKs only (requeue, redelivered to it).
            frames = b"".join(b"NACK\nid:%s\n\n\0" % a for a in acks[:-1])
            if acks:
                frames += b"NACK\nid:%s\nreceipt:nacked\n\n\0" % acks[-1]
            t = time.monotonic()
            t_ns = now_ns()
            d = ctx.deadline(ctx.phase())
            view = memoryview(frames)
            while view and time.monotonic() < d and not c.eof:
                k = c.try_send(view[:262144])
                view = view[k:]
                if not k:
                    time.sleep(0.01)
            r.data["nack_bytes_unsent"] = len(view)
            r.data["nack_write_s"] = round(time.monotonic() - t, 2)
            # Let the broker work while still not reading, then read and find the receipt.
            hold = time.monotonic() + ctx.t(5, 3)
            while time.monotonic() < hold:
                time.sleep(0.1)
            ok, why = wait_receipt(c, "nacked", d)
            r.data["nack_phase_s"] = round(time.monotonic() - t, 2)
            r.phase("nack_phase", t_ns)
            r.data["nack_outcome"] = why or "ok"
            r.check(ok, f"NACK phase did not finish within {ctx.phase():g} s: {why}")
        finally:
            c.abort()


# =============================================================== 7. connection caps
def attack_conn_cap(ctx: Ctx) -> None:
    """7: 3,000 connections from one address; how many does the broker accept?"""
    n = ctx.n(3000, 1000)
    with ctx.measure("conn-cap", f"x{n}") as r:
        t = time.monotonic()
        conns, errs = open_many(ctx.host, ctx.port, n, ctx.deadline(30), concurrency=500)
        r.data["tcp_open_s"] = round(time.monotonic() - t, 2)
        try:
            cf = connect_frame("1.2")
            d = ctx.deadline(10)
            for c in conns:
                try:
                    c.send(cf, d)
                except WireError:
                    pass
            watch(conns, ctx.deadline(ctx.t(10, 6)),
                  until=lambda c: b"CONNECTED\n" in c.buf or b"ERROR\n" in c.buf)
            connected = sum(1 for c in conns if b"CONNECTED\n" in c.buf)
            refused = sum(1 for c in conns if b"ERROR\n" in c.buf)
            closed = sum(1 for c in conns if c.eof and b"CONNECTED\n" not in c.buf)
            r.data.update(attempted=n, tcp_connected=len(conns), tcp_errors=len(errs), stomp_connected=connected,
                          stomp_refused=refused, closed_without_connected=closed,
                          broker_fds_peak=ctx.broker_fds())
            errs_by = {}
            for e in errs:
                errs_by[e] = errs_by.get(e, 0) + 1
            r.data["tcp_error_kinds"] = errs_by
            r.note = f"accepted {connected}/{n}"
        finally:
            close_all(conns)


# =============================================================== 1. topic pattern bomb
def attack_topic_bomb(ctx: Ctx) -> None:
    """1: topic binding patterns whose matching explodes; a publisher then sends short keys."""
    pub_deadline = ctx.t(ctx.args.bomb_deadline, min(ctx.args.bomb_deadline, 8.0))
    keys = ctx.n(3, 1)
    along = ctx.args.bomb_key_words if not ctx.quick else min(ctx.args.bomb_key_words, 18)
    lkw = ctx.args.long_key_words if not ctx.quick else min(ctx.args.long_key_words, 1500)
    variants = [
        ("hash1500", ".".join(["#"] * 1500), [f"k{i}.b.c" for i in range(keys)], False),
        ("hash-a-60", ".".join(["#", "a"] * 30), ["a.a.a"] + [".".join(["a"] * along)] * 1, False),
        # A short, harmless-looking pattern is enough when the routing key is long:
        # backtracking over '#' costs O(words^hashes).
        ("3-word-pattern-long-key", "#.a.#", [".".join(["a"] * lkw)], False),
        ("hash600", ".".join(["#"] * 600), [f"k{i}.b.c" for i in range(keys)], False),
        ("hash600-durable", ".".join(["#"] * 600), [f"k{i}.b.c" for i in range(keys)], True),
    ]
    for name, pattern, pub_keys, durable in variants:
        with ctx.measure("topic-bomb", name) as r:
            _topic_bomb(ctx, r, name, pattern, pub_keys, durable, pub_deadline)
        if r.data.get("wedged") and ctx.broker is not None:
            if durable:
                # Does the bomb come back after a restart with the same data directory?
                log("restarting with the same data directory: does the durable pattern survive?")
                with ctx.measure("topic-bomb", "hash600-durable-after-restart") as r2:
                    r2.canary_applies = False
                    ctx.restart("topic-bomb/hash600-durable (same data dir)", fresh=False)
                    ok, lat = _topic_publish(ctx, f"after.{ctx.run}.x", min(pub_deadline, 5.0))
                    r2.data.update(publish_ok=ok, publish_s=lat, survives_restart=not ok)
                    r2.check(ok, "a topic publish after a restart is wedged again: the durable pattern "
                                 "was stored and recovered")
                ctx.ensure_healthy("topic-bomb durable check", timeout=3)
            else:
                ctx.ensure_healthy(f"topic-bomb/{name}", timeout=3)
        else:
            ctx.ensure_healthy(f"topic-bomb/{name}")


def _topic_publish(ctx: Ctx, key: str, seconds: float) -> tuple[bool, float]:
    t = time.monotonic()
    try:
        c = ctx.connect(seconds=seconds)
    except WireError:
        return False, round(time.monotonic() - t, 2)
    try:
        c.send(frame("SEND", {"destination": "/topic/" + key, "receipt": "tp"}, b"x"), ctx.deadline(seconds))
        ok, _ = wait_receipt(c, "tp", ctx.deadline(seconds))
        return ok, round(time.monotonic() - t, 3)
    finally:
        c.close()


def _topic_bomb(ctx: Ctx, r: Result, name: str, pattern: str, keys: list[str], durable: bool,
                pub_deadline: float) -> None:
    dest = "/topic/" + pattern
    cid = f"hostile-{ctx.run}-bomb-{name}"
    d = ctx.deadline(10)
    att = ctx.connect(extra=(("client-id", cid),))
    sub = {"id": "bomb", "destination": dest, "ack": "client" if durable else "auto"}
    if durable:
        sub.update({"durable": "true", "activemq.subscriptionName": "bomb"})
    t = time.monotonic()
    att.send(frame("SUBSCRIBE", {**sub, "receipt": "sb"}), d)
    ok, why = wait_receipt(att, "sb", d)
    r.data["pattern_words"] = len(pattern.split("."))
    r.data["subscribe"] = "accepted" if ok else why
    r.data["subscribe_s"] = round(time.monotonic() - t, 3)
    if not ok:
        att.close()
        r.note = f"SUBSCRIBE refused: {why}"
        pub_ok, lat = _topic_publish(ctx, f"probe.{ctx.run}.x", 5)
        r.check(pub_ok, "topic publishing broken after the refused SUBSCRIBE")
        return
    if durable:
        att.send(frame("DISCONNECT", {"receipt": "bye"}), d)
        att.wait_for(lambda c: c.eof, d)
        att.close()
    pub = ctx.connect()
    lats = []
    wedged = False
    outcome = []
    try:
        for i, key in enumerate(keys):
            t = time.monotonic()
            pub.send(frame("SEND", {"destination": "/topic/" + key, "receipt": f"k{i}"}, b"bomb"),
                     ctx.deadline(pub_deadline))
            ok, why = wait_receipt(pub, f"k{i}", ctx.deadline(pub_deadline))
            lats.append(round(time.monotonic() - t, 3))
            outcome.append(why or "ok")
            if not ok:
                wedged = why == "timeout"
                break
    finally:
        pub.close()
    r.data.update(publish_keys=[k[:60] for k in keys[: len(lats)]], publish_s=lats, publish_outcome=outcome,
                  wedged=wedged)
    if wedged:
        if not durable:
            att.close()
        r.fail(f"broker wedged: no RECEIPT within {pub_deadline:g} s for a publish to '{keys[len(lats) - 1][:40]}'")
        return
    r.check(all(o == "ok" for o in outcome), f"publisher refused: {outcome}")
    # Is topic publishing still fine for everyone else (while the pattern is bound)?
    probe_ok, probe_s = _topic_publish(ctx, f"probe.{ctx.run}.x.y", 5)
    r.data.update(topic_probe_ok=probe_ok, topic_probe_s=probe_s)
    r.check(probe_ok, "while the pattern is bound, an unrelated topic publish fails (topic routing broken "
                      "for everyone)")
    if not durable:
        att.close()
        time.sleep(0.2)
        ok2, _ = _topic_publish(ctx, f"probe.{ctx.run}.x.z", 5)
        r.data["topic_probe_after_leave_ok"] = ok2
    if durable:
        c = ctx.connect(extra=(("client-id", cid),))
        try:
            c.send(frame("UNSUBSCRIBE", {"id": "bomb", "durable": "true", "activemq.subscriptionName": "bomb",
                                         "receipt": "u"}), ctx.deadline(5))
            wait_receipt(c, "u", ctx.deadline(5))
        except WireError:
            pass
        finally:
            c.close()


# =============================================================== registry and main
ATTACKS: dict[str, Callable[[Ctx], None]] = {
    "hb-digits": attack_hb_digits,
    "stray-bytes": attack_stray_bytes,
    "error-excerpt": attack_error_excerpt,
    "nack-requeue": attack_nack_requeue,
    "nack-forever": attack_nack_forever,
    "sub-unsub": attack_sub_unsub,
    "nul-inject": attack_nul_inject,
    "tls-close": lambda ctx: None,  # run through attack_close_paths (with half-frame)
    "half-frame": lambda ctx: None,
    "fanout-subs": attack_fanout_subs,
    "cumulative-ack": attack_cumulative_ack,
    "nack-paused": attack_nack_paused,
    "transactions": attack_transactions,
    "cache-bloat": attack_cache_bloat,
    "sub-id-bloat": attack_sub_id_bloat,
    "slow-fanout": attack_slow_fanout,
    "partial-bodies": attack_partial_bodies,
    "flood": attack_flood,
    "durable-flood": attack_durable_flood,
    "conn-cap": attack_conn_cap,
    "topic-bomb": attack_topic_bomb,
}
GROUPS = {
    "small": ["half-frame", "hb-digits", "nack-requeue", "stray-bytes", "error-excerpt", "nack-forever", "sub-unsub"],
    "memory": ["flood", "durable-flood", "partial-bodies", "transactions", "cache-bloat", "sub-id-bloat",
               "slow-fanout"],
    "quadratic": ["fanout-subs", "cumulative-ack", "nack-paused"],
    "close": ["tls-close", "half-frame"],
}
# Run order: cheap and non-destructive first, the broker-wedging topic bomb last.
ORDER = ["hb-digits", "stray-bytes", "error-excerpt", "nack-requeue", "nul-inject", "tls-close", "half-frame",
         "nack-forever", "sub-unsub", "transactions", "cache-bloat", "sub-id-bloat",
         "slow-fanout", "partial-bodies", "flood", "durable-flood",
         "fanout-subs", "cumulative-ack", "nack-paused", "conn-cap", "topic-bomb"]


def source_version(source: Path) -> str:
    """``git describe --always --dirty`` of a source tree (an archive: the commit asked for)."""
    r = subprocess.run(["git", "-C", str(source), "describe", "--always", "--dirty"], capture_output=True,
                       text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def select_attacks(spec: str) -> list[str]:
    wanted: set[str] = set()
    for name in spec.split(","):
        name = name.strip()
        if not name:
            continue
        if name == "all":
            wanted.update(ORDER)
        elif name in GROUPS:
            wanted.update(GROUPS[name])
        elif name in ATTACKS:
            wanted.add(name)
        else:
            raise SystemExit(f"unknown attack {name!r}; known: all, {', '.join(GROUPS)}, {', '.join(ORDER)}")
    return [a for a in ORDER if a in wanted]


def summary(ctx: Ctx, canary_total: dict[str, Any], wall: float) -> str:
    rows = [("attack", "status", "canary p99/worst ms", "RSS MiB before/peak/after", "open/total", "rcpt/deliv",
             "note")]
    for r in ctx.results:
        c = r.canary
        can = f"{c.get('p99_ms', '-')}/{c.get('worst_ms', '-')}" if c.get("n") else "-"
        rss = f"{r.rss_mib.get('before', '-')}/{r.rss_mib.get('peak', '-')}/{r.rss_mib.get('after', '-')}"
        d = r.data
        if "connections" in d and "still_open" in d:
            op = f"{d['still_open'] + d.get('closed_late', 0)}/{d['connections']}"
        else:
            op = ""
        if "receipted_ids" in d:
            rd = f"{d.get('receipted_delivered', '?')}/{d['receipted_ids']}"
        else:
            rd = ""
        note = r.note or (r.reasons[0] if r.reasons else "")
        rows.append((r.name, r.status, can, rss, op, rd, note[:90]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(str(v).ljust(widths[i]) for i, v in enumerate(row)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    passed = sum(1 for r in ctx.results if r.status == "PASS")
    out.append("")
    out.append(f"{passed}/{len(ctx.results)} PASS in {wall:.0f} s; canary overall: {canary_total}")
    if ctx.restarts:
        out.append("broker restarts: " + "; ".join(ctx.restarts))
    out.append(f"thresholds: canary p99 < {CANARY_P99_MS:g} ms and worst < {CANARY_WORST_MS:g} ms during every "
               f"attack; no receipted message lost; broker closes within --close-deadline "
               f"({ctx.args.close_deadline:g} s) of the due time")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", action="store_true", help="start twistd -n qmq from --source and stop it at the end")
    ap.add_argument("--source", default=str(REPO), help="QMQ source tree for --start (default: this repository)")
    ap.add_argument("--source-commit", help="--start a 'git archive' of this commit of the repository instead")
    ap.add_argument("--config", help="TOML config for --start (default: a generated one with short timeouts)")
    ap.add_argument("--set", action="append", metavar="TABLE.KEY=VALUE",
                    help="extra setting in the generated config (dropped if this broker lacks it)")
    ap.add_argument("--set-force", action="append", default=[], metavar="TABLE.KEY",
                    help="keep this --set key even if the broker does not list it")
    ap.add_argument("--broker-config", help="without --start: the TOML the broker runs with (for its timeouts)")
    ap.add_argument("--no-tls", action="store_true", help="with --start: no TLS listener")
    ap.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1"], help="loopback only")
    ap.add_argument("--port", type=int, help="STOMP TCP port (with --start: default a free port)")
    ap.add_argument("--tls-port", type=int, help="STOMP TLS port (with --start: default a free port)")
    ap.add_argument("--pid", type=int, help="broker PID (default: found from the listening port)")
    ap.add_argument("--attacks", default="all", help="comma list of attacks or groups (default all)")
    ap.add_argument("--quick", action="store_true", help="scale everything down (about 2-3 minutes)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every count")
    ap.add_argument("--out", help="append the JSON lines to this file too")
    ap.add_argument("--close-deadline", type=float, default=15.0,
                    help="seconds after its due time within which the broker must close a socket (default 15)")
    ap.add_argument("--idle-deadline", type=float, default=30.0,
                    help="longest wait for a close that is due later (idle timeouts; default 30)")
    ap.add_argument("--recover", type=float, default=30.0,
                    help="seconds to wait for the broker to answer the canary after an attack (default 30)")
    ap.add_argument("--rtt-timeout", type=float, default=120.0, help="canary round-trip timeout (default 120)")
    ap.add_argument("--canary-interval", type=float, default=5.0, help="ms between canary round trips (default 5)")
    ap.add_argument("--canary-source", default="127.0.0.2",
                    help="source address of the canary (default 127.0.0.2; '' for the default)")
    ap.add_argument("--flood-seconds", type=float, default=20.0, help="flood duration (default 20; --quick 5)")
    ap.add_argument("--memory-mark", type=float, help="MiB: the broker's memory high-water mark, to check against")
    ap.add_argument("--rss-limit", type=float, default=4096.0,
                    help="MiB: the flood stops when the broker's RSS passes this (safety, default 4096)")
    ap.add_argument("--partial-mib", type=float, default=4.0,
                    help="MiB each partial-body connection sends of its 16 MiB body (default 4; --quick 1)")
    ap.add_argument("--phase-deadline", type=float, default=60.0,
                    help="seconds one phase of a quadratic-path attack may take (default 60; --quick 40)")
    ap.add_argument("--bomb-deadline", type=float, default=20.0,
                    help="seconds a topic-bomb publish may take before the broker counts as wedged (default 20)")
    ap.add_argument("--bomb-key-words", type=int, default=20,
                    help="words of the long key published against '#.a.#.a...' (default 20; --quick 18)")
    ap.add_argument("--long-key-words", type=int, default=3000,
                    help="words of the routing key published against '#.a.#' (default 3000; --quick 1500)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_nofile()
    attacks = select_attacks(args.attacks)
    workdir = Path(tempfile.mkdtemp(prefix="hostile-"))
    broker: BrokerProc | None = None
    archive_dir = None
    try:
        if args.source_commit:
            archive_dir = workdir / f"src-{args.source_commit}"
            archive_dir.mkdir()
            tar = subprocess.run(["git", "-C", str(REPO), "archive", args.source_commit], capture_output=True,
                                 check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(archive_dir)], input=tar, check=True)
            args.source = str(archive_dir)
        if args.start:
            broker = BrokerProc(args, workdir)
            broker.start()
            settings = broker.effective()
            log(f"broker started: pid {broker.pid} tcp {broker.port} tls {broker.tls_port} "
                f"source {broker.source} config {broker.applied} (dropped: {broker.dropped}) log {broker.log_path}")
        else:
            if not args.port:
                raise SystemExit("--port is required without --start")
            settings = {}
            if args.broker_config:
                settings = tomllib.loads(Path(args.broker_config).read_text()).get("stomp", {})
        ctx = Ctx(args, broker, settings)
        if not ctx.pid:
            log("warning: broker PID not found (RSS will read as nan); pass --pid")
        header = {"hostile": "start", "attacks": attacks, "quick": args.quick, "port": ctx.port,
                  "tls_port": ctx.tls_port, "pid": ctx.pid, "settings": settings, "run": ctx.run,
                  "source": str(broker.source) if broker else None,
                  "source_version": (args.source_commit or source_version(Path(args.source))) if broker else None,
                  "source_commit": args.source_commit,
                  "config_applied": broker.applied if broker else None,
                  "config_dropped": broker.dropped if broker else None}
        print(json.dumps(header), flush=True)
        if ctx.out:
            ctx.out.write(json.dumps(header) + "\n")
        t_start = time.monotonic()
        ctx.start_helpers()
        close_done = False
        try:
            for name in attacks:
                if name in ("tls-close", "half-frame"):
                    if close_done:
                        continue
                    close_done = True
                    attack_close_paths(ctx, {a for a in attacks if a in ("tls-close", "half-frame")})
                else:
                    ATTACKS[name](ctx)
                if name != "topic-bomb":
                    ctx.ensure_healthy(name)
        except Unhealthy as e:
            log(str(e))
            done = {r.attack for r in ctx.results}
            for name in attacks:
                if name not in done:
                    r = Result(name, "", status="SKIP", reasons=[str(e)])
                    ctx.results.append(r)
                    print(json.dumps(r.as_json()), flush=True)
        except KeyboardInterrupt:
            log("interrupted")
        finally:
            canary_total = ctx.stop_helpers()
        wall = time.monotonic() - t_start
        table = summary(ctx, canary_total, wall)
        print(table, file=sys.stderr if args.out is None else sys.stderr, flush=True)
        tail = {"hostile": "end", "canary": canary_total, "restarts": ctx.restarts, "wall_s": round(wall, 1),
                "passed": sum(1 for r in ctx.results if r.status == "PASS"), "results": len(ctx.results)}
        print(json.dumps(tail), flush=True)
        if ctx.out:
            ctx.out.write(json.dumps(tail) + "\n")
            ctx.out.close()
            Path(args.out + ".txt").write_text(table + "\n")
        return 0
    finally:
        if broker is not None:
            broker.stop()
            keep = workdir / "broker.log"
            if keep.exists():
                dest = Path(tempfile.gettempdir()) / f"hostile-broker-{int(time.time())}.log"
                shutil.copy(keep, dest)
                log(f"broker log kept at {dest}")
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
