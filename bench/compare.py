#!/usr/bin/env python3
"""Compare QMQ with its peers: start each broker, run the scenarios, report.

    python bench/compare.py --reps 3 --brokers qmq,rabbitmq,activemq,coilmq --out bench/results/

STOMP over WebSocket: the brokers ``qmq-ws`` (QMQ with an ``http:`` listener,
path ``/ws``) and ``rabbitmq-ws`` (RabbitMQ's web-stomp on 15684, ``/ws``)
run the same scenarios through a WebSocket client (one STOMP frame per
message, as browsers send, unless ``--ws-batch``)::

    python bench/compare.py --reps 1 --brokers qmq,qmq-ws,rabbitmq-ws \
        --scenarios queue-auto,fanout --out /tmp/ws-bench

For each repetition, each broker in turn (the order rotates from one
repetition to the next, so drift hits all brokers alike) is started fresh,
runs every scenario, and is stopped (``--restart once`` keeps every broker up
for the whole run instead). QMQ runs from this repository with
``twistd -n qmq``; the peers through ``../shared/peers/peers.sh``.

Writes to ``--out``: ``results.jsonl`` (one line per scenario run, plus
``rep``), ``meta.json`` (machine and versions), ``table.txt`` (median of
reps, QMQ vs best peer) and ``chart.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
import run  # noqa: E402
from loadgen import Target  # noqa: E402
from procstat import cpu_seconds, pid_by_port, system_busy_seconds  # noqa: E402
from profiles import get_profile  # noqa: E402
from scenarios import CORE, PERSIST, run_one  # noqa: E402

REPO = HERE.parent


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Return True if something accepts TCP connections on ``port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, timeout: float, up: bool = True) -> bool:
    """Wait until ``port`` is open (or closed); return whether it happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port) == up:
            return True
        time.sleep(0.25)
    return port_open(port) == up


class Broker:
    """A broker the comparison can start, stop and locate."""

    #: The profile (quirks) of the broker's STOMP.
    profile = "generic"
    #: Over a WebSocket: the HTTP port and path the clients use, else None.
    ws_port: int | None = None
    ws_path: str | None = None

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.pid: int | None = None

    def start(self) -> None:
        """Start the broker and wait for its STOMP port."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the broker."""
        raise NotImplementedError

    def version(self) -> str:
        """Return a version string."""
        return "?"


class Peer(Broker):
    """A peer broker driven by ``peers.sh``."""

    def __init__(self, name: str, port: int, shared: Path, wipe: bool, adopt: bool = False,
                 peer: str | None = None) -> None:
        super().__init__(name, port)
        #: The name peers.sh knows it by (``rabbitmq`` for ``rabbitmq-ws``).
        self.peer = peer or name
        self.profile = self.peer
        self.script = shared / "peers" / "peers.sh"
        self.wipe = wipe
        self.adopt = adopt
        self.adopted = False

    def _sh(self, cmd: str, timeout: float = 180) -> str:
        r = subprocess.run(
            ["bash", str(self.script), cmd, self.peer],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return (r.stdout + r.stderr).strip()

    def start(self) -> None:
        """Start via peers.sh (wiping stored state first if asked)."""
        if port_open(self.port):
            if not self.adopt:
                raise RuntimeError(f"port {self.port} already in use: is {self.name} running already?")
            self.adopted = True
            self.pid = pid_by_port(self.port)
            return
        if self.wipe:
            self._sh("wipe", 60)
        out = self._sh("start")
        if not wait_port(self.port, 60):
            raise RuntimeError(f"{self.name} did not open port {self.port}: {out[-300:]}")
        try:
            self.pid = int(self._sh("pid", 10).split()[0])
        except (ValueError, IndexError):
            self.pid = pid_by_port(self.port)

    def stop(self) -> None:
        """Stop via peers.sh (and wipe stored state if asked); leave adopted ones be."""
        if self.adopted:
            return
        self._sh("stop", 120)
        wait_port(self.port, 30, up=False)
        if self.wipe:
            self._sh("wipe", 60)
        self.pid = None

    def version(self) -> str:
        """Return the Debian package or PyPI version."""
        if self.peer in ("rabbitmq", "activemq"):
            pkg = "rabbitmq-server" if self.peer == "rabbitmq" else "activemq"
            r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
            return r.stdout.strip() or "?"
        if self.peer == "coilmq":
            run_dir = Path(os.environ.get("QMQ_BENCH_RUN", "/tmp/qmqbench"))
            py = run_dir / "coilmq-venv" / "bin" / "python"
            r = subprocess.run(
                [str(py), "-c", "import importlib.metadata as m; print(m.version('coilmq'))"],
                capture_output=True,
                text=True,
            )
            return r.stdout.strip() or "?"
        return "?"


class QMQ(Broker):
    """QMQ from this repository, run in the foreground by ``twistd -n qmq``."""

    def __init__(
        self,
        port: int,
        tls_port: int | None,
        workdir: Path,
        extra: list[str],
        name: str = "qmq",
        source: Path = REPO,
        store: str = "memory",
        http_port: int | None = None,
    ) -> None:
        super().__init__(name, port)
        self.store = store
        self.profile = "qmq"
        self.http_port = http_port
        if http_port:
            self.ws_port, self.ws_path = http_port, "/ws"
        self.tls_port = tls_port
        self.workdir = workdir.resolve()
        self.extra = extra
        self.source = source.resolve()
        self.proc: subprocess.Popen[bytes] | None = None

    def _cert(self) -> tuple[Path, Path]:
        key, cert = self.workdir / "key.pem", self.workdir / "cert.pem"
        if not cert.exists():
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                 "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                check=True,
                capture_output=True,
            )
        return key, cert

    def start(self) -> None:
        """Start twistd with a plain and (optionally) a TLS STOMP listener."""
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} already in use")
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        twistd = Path(sys.executable).parent / "twistd"
        cmd = [str(twistd), "-n", "--pidfile=", f"--logfile={self.workdir / 'twistd.log'}", "qmq",
               "--listen", f"stomp:tcp:{self.port}:interface=127.0.0.1:backlog=1024",
               "--data-dir", str(data)]
        if self.tls_port:
            key, cert = self._cert()
            cmd += ["--listen", f"stomp:ssl:{self.tls_port}:privateKey={key}:certKey={cert}"
                    ":interface=127.0.0.1:backlog=1024"]
        if self.http_port:
            cmd += ["--listen", f"http:tcp:{self.http_port}:interface=127.0.0.1:backlog=1024"]
        conf_text = ""
        if self.store != "memory":
            # Durable queues on the commit log, a receipt only after fsync.
            conf_text += f'store = "{self.store}"\n\n[commit_log]\nfsync = "always"\n\n'
        elif 'store = "log"' in (self.source / "qmq" / "default.toml").read_text():
            # A tree whose default is the commit log, asked for memory.
            conf_text += 'store = "memory"\n\n'
        if (self.source / "qmq" / "connections.py").exists():
            # The load generator opens thousands of connections from one
            # address: lift the per-address and per-listener caps (a QMQ
            # without them, an older commit, takes no such table).
            conf_text += "[connections]\nmax_per_address = 0\nmax_per_listener = 0\n"
        if conf_text:
            conf = self.workdir / "bench.toml"
            conf.write_text(conf_text)
            cmd += ["--config", str(conf)]
        cmd += self.extra
        env = dict(os.environ, PYTHONPATH=str(self.source) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = open(self.workdir / "console.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None and not port_open(self.port):
            time.sleep(0.2)
        if not port_open(self.port):
            self.stop()
            tail = (self.workdir / "console.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"qmq did not start: {tail}")
        self.pid = self.proc.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        self.pid = None

    def version(self) -> str:
        """Return the commit of the tree it runs from (this repository, or
        C{--qmq-base}'s checkout)."""
        r = subprocess.run(["git", "-C", str(self.source), "describe", "--always", "--dirty"],
                           capture_output=True, text=True)
        return "git " + (r.stdout.strip() or "?")


def wait_quiet(exclude_pid: int | None, max_wait: float, threshold: float = 0.25) -> float:
    """Wait (up to ``max_wait`` s) until other processes use < ``threshold`` of a core.

    Returns the busy fraction (cores) other processes used in the last second.
    """
    deadline = time.monotonic() + max_wait
    while True:
        b0, c0 = system_busy_seconds(), cpu_seconds(exclude_pid) if exclude_pid else 0.0
        time.sleep(1.0)
        b1, c1 = system_busy_seconds(), cpu_seconds(exclude_pid) if exclude_pid else 0.0
        busy = max(0.0, (b1 - b0) - (c1 - c0))
        if busy < threshold or time.monotonic() >= deadline:
            return round(busy, 2)
        time.sleep(2.0)


def machine_info() -> dict[str, Any]:
    """Describe the machine (cores, CPU model, kernel, Python, Twisted)."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import twisted

        tw = twisted.__version__
    except ImportError:
        tw = "?"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "twisted": tw,
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--brokers", default="qmq,rabbitmq,activemq,coilmq")
    ap.add_argument("--scenarios", default=",".join(CORE), help="comma list; 'all', 'follow-up' too")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="where peers/peers.sh is")
    ap.add_argument("--restart", choices=["per-rep", "once"], default="per-rep",
                    help="fresh broker for each rep (default) or one start for the whole run")
    ap.add_argument("--adopt", action="store_true",
                    help="use a peer already listening on its port (and leave it running)")
    ap.add_argument("--qmq-port", type=int, default=61653)
    ap.add_argument("--qmq-tls-port", type=int, default=61654, help="0: no TLS listener")
    ap.add_argument("--qmq-http-port", type=int, default=15653,
                    help="the HTTP (WebSocket) port of broker qmq-ws")
    ap.add_argument("--qmq-arg", action="append", default=[], help="extra twistd qmq argument")
    ap.add_argument("--qmq-store", choices=["auto", "memory", "log"], default="auto",
                    help="QMQ's store; auto: the commit log (fsync always) when a persist "
                    "scenario runs, else memory")
    ap.add_argument("--qmq-base", type=Path,
                    help="a checkout of another QMQ commit (git worktree) to run beside this one as "
                         "broker 'qmq-base' (add it to --brokers), e.g. the commit before a change")
    ap.add_argument("--warmup-runs", type=int, default=30_000,
                    help="messages of an unrecorded queue-auto (and a tenth as many fan-out) "
                    "after each broker start; 0: none")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="before each scenario wait up to this long for the machine to be quiet")
    run.add_common(ap)
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    names = [b.strip() for b in args.brokers.split(",") if b.strip()]
    scen = run.expand([s.strip() for s in args.scenarios.split(",") if s.strip()])
    store = args.qmq_store
    if store == "auto":
        store = "log" if any(s in PERSIST for s in scen) else "memory"
    brokers: dict[str, Broker] = {}
    for n in names:
        if n == "qmq":
            brokers[n] = QMQ(args.qmq_port, args.qmq_tls_port or None, args.out / "qmq-run", args.qmq_arg,
                             store=store)
        elif n == "qmq-ws":
            brokers[n] = QMQ(args.qmq_port + 20, None, args.out / "qmq-ws-run", args.qmq_arg,
                             name=n, store=store, http_port=args.qmq_http_port)
        elif n == "rabbitmq-ws":
            rabbit = Peer(n, get_profile("rabbitmq").port, args.shared,
                          wipe=args.restart == "per-rep", adopt=args.adopt, peer="rabbitmq")
            rabbit.ws_port, rabbit.ws_path = 15684, "/ws"  # web-stomp (peers.sh)
            brokers[n] = rabbit
        elif n == "qmq-base":
            if args.qmq_base is None:
                ap.error("broker qmq-base needs --qmq-base DIR")
            brokers[n] = QMQ(args.qmq_port + 10, (args.qmq_tls_port + 10) if args.qmq_tls_port else None,
                             args.out / "qmq-base-run", args.qmq_arg, name=n, source=args.qmq_base,
                             store=store)
        else:
            brokers[n] = Peer(n, get_profile(n).port, args.shared, wipe=args.restart == "per-rep",
                              adopt=args.adopt)
    meta = {"machine": machine_info(), "brokers": {}, "scenarios": scen, "reps": args.reps,
            "argv": sys.argv[1:], "qmq_store": store}
    for n, b in brokers.items():
        meta["brokers"][n] = {"version": b.version(), "port": b.port}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    jsonl = args.out / "results.jsonl"
    jsonl.write_text("")
    results: list[dict[str, Any]] = []

    def emit(rec: dict[str, Any]) -> None:
        results.append(rec)
        with jsonl.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        brief = {k: rec.get(k) for k in ("rep", "broker", "scenario", "rate", "unit", "p50_us",
                                          "rss_per_conn_kib", "broker_cpu_us_per_unit", "error")}
        print(json.dumps({k: v for k, v in brief.items() if v is not None}), flush=True)

    running: set[str] = set()
    try:
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for n in order:
                b = brokers[n]
                if n not in running:
                    running.add(n)  # so that an interrupt during start still stops it
                    try:
                        b.start()
                    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                        b.stop()
                        running.discard(n)
                        for s in scen:
                            emit({"rep": rep, "broker": n, "scenario": s, "error": f"start failed: {e}"})
                        continue
                prof = get_profile(b.profile)
                if isinstance(b, QMQ):
                    prof = prof.with_overrides(port=b.port, tls_port=b.tls_port,
                                               data_dir=str(b.workdir / "data"),
                                               durable=b.store != "memory")
                if b.ws_port:
                    target = Target("127.0.0.1", b.ws_port, prof, ws_path=b.ws_path,
                                    ws_batch=args.ws_batch)
                else:
                    target = Target("127.0.0.1", b.port, prof)
                if args.warmup_runs:
                    # Unrecorded warm-up (JIT, allocators, first-queue set-up).
                    for s in ("queue-auto", "fanout"):
                        w = run.options_from(args, s)
                        w.count = args.warmup_runs if s == "queue-auto" else max(1, args.warmup_runs // 10)
                        wr = run_one(s, target, w, b.pid)
                        print(json.dumps({"warmup": n, "scenario": s, "rate": wr.get("rate"),
                                          "error": wr.get("error")}), flush=True)
                for s in scen:
                    busy = wait_quiet(b.pid, args.quiet_wait)
                    rec = {"rep": rep, **run_one(s, target, run.options_from(args, s), b.pid)}
                    rec["broker"] = n  # qmq-base runs with qmq's profile
                    rec["busy_before_cores"] = busy
                    if b.pid and not Path(f"/proc/{b.pid}").exists():
                        rec.setdefault("error", "broker process died")
                        emit(rec)
                        running.discard(n)
                        break
                    emit(rec)
                if args.restart == "per-rep" and n in running:
                    b.stop()
                    running.discard(n)
    except KeyboardInterrupt:
        print("interrupted; stopping brokers", file=sys.stderr)
    finally:
        for n in list(running):
            brokers[n].stop()

    table = report.render_table(results)
    m = meta["machine"]
    header = (f"QMQ benchmark {m['date']}: {m['nproc']} cores, {m['cpu']}, Python {m['python']}; "
              + ", ".join(f"{n} {v['version']}" for n, v in meta["brokers"].items())
              + f"; {args.reps} reps\n\n")
    (args.out / "table.txt").write_text(header + table)
    try:
        report.render_chart(results, args.out / "chart.png", header.strip())
    except ImportError as e:
        print(f"no chart: {e}", file=sys.stderr)
    sys.stdout.write("\n" + header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
