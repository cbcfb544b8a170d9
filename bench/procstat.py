"""Read a broker's CPU time and RSS from ``/proc`` and find its PID by port.

Only Linux ``/proc`` is used: ``/proc/PID/stat`` (utime + stime, in clock
ticks), ``/proc/PID/status`` (VmRSS) and, to find the process that listens on
a TCP port, ``/proc/net/tcp{,6}`` (socket inode of the listening socket)
matched against the ``socket:[INODE]`` links in ``/proc/*/fd``.

CPU and RSS are summed over the process and its descendants, so that brokers
that fork helpers (Erlang's port programs, a JVM launcher) are counted whole.
"""

from __future__ import annotations

import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """Return the fields of ``/proc/PID/stat`` after the command name."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode("ascii", "replace")
    # The command name is in parentheses and may contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def children_tree(pid: int) -> list[int]:
    """Return ``pid`` and all its live descendants (walks ``/proc/*/stat``)."""
    parent_of: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            parent_of[int(name)] = int(_stat_fields(int(name))[1])
        except (OSError, ValueError, IndexError):
            continue
    tree = [pid]
    frontier = [pid]
    for _ in range(16):  # bounded depth
        nxt = [c for c, p in parent_of.items() if p in frontier]
        if not nxt:
            break
        tree.extend(nxt)
        frontier = nxt
    return tree


def user_system_seconds(pid: int) -> tuple[float, float]:
    """Return the user and the system CPU seconds of ``pid`` alone."""
    fields = _stat_fields(pid)
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """Return utime+stime of ``pid`` (and descendants), in seconds."""
    total = 0
    for p in children_tree(pid) if tree else [pid]:
        try:
            fields = _stat_fields(p)
        except OSError:
            continue
        # fields[0] is state (field 3); utime is field 14, stime field 15.
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def rss_kib(pid: int, tree: bool = True) -> int:
    """Return the resident set size of ``pid`` (and descendants) in KiB."""
    total = 0
    for p in children_tree(pid) if tree else [pid]:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total


def _listen_inodes(port: int) -> set[str]:
    """Return inodes of sockets listening on ``port`` (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            continue
    return inodes


def pid_by_port(port: int) -> int | None:
    """Return the PID of the process listening on TCP ``port``, or None.

    Needs permission to read other processes' ``/proc/PID/fd`` (same user or
    root). When several processes share the socket, the lowest PID wins.
    """
    wanted = {f"socket:[{i}]" for i in _listen_inodes(port)}
    if not wanted:
        return None
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in wanted:
                    found.append(int(name))
                    break
            except OSError:
                continue
    return min(found) if found else None


def system_busy_seconds() -> float:
    """Return the CPU seconds all cores spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def all_process_ticks() -> dict[int, tuple[int, str]]:
    """Return ``{pid: (utime+stime ticks, command name)}`` for every process."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except OSError:
            continue
        try:
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2 :].split()
            out[int(name)] = (int(fields[11]) + int(fields[12]), comm)
        except (ValueError, IndexError):
            continue
    return out


def top_consumers(
    before: dict[int, tuple[int, str]], after: dict[int, tuple[int, str]], exclude: set[int], n: int = 3
) -> list[tuple[str, float]]:
    """Return the ``n`` processes (not in ``exclude``) that used most CPU between two snapshots."""
    used = []
    for pid, (ticks, comm) in after.items():
        if pid in exclude:
            continue
        delta = ticks - before.get(pid, (0, comm))[0]
        if delta > 0:
            used.append((f"{comm}[{pid}]", round(delta / CLK_TCK, 2)))
    used.sort(key=lambda x: -x[1])
    return used[:n]


def self_cpu() -> float:
    """Return this process's own user+system CPU seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def raise_nofile() -> int:
    """Raise the soft open-files limit to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
