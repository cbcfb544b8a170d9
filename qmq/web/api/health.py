# -*- test-case-name: tests.test_web_health -*-
"""Health checks under C{/api/v1/health}: liveness, readiness, one check each.

RabbitMQ's health checks (C{/api/health/checks/alarms},
C{.../local-alarms}, C{.../port-listener/PORT}, ...) are the model. The
flow of a request:

    C{GET /api/v1/health/live}    the process answers: always C{200}
                                  C{{"status": "ok"}}, anyone may ask
    C{GET /api/v1/health/ready}   every check below passes: C{200}, else
    (and C{/api/v1/health})       C{503} with C{Retry-After}; anyone may ask,
                                  and the answer reveals little: each check's
                                  name and whether it passes, and the names of
                                  the alarms that hold (C{memory}, C{disk},
                                  C{store}); no texts, ports or sizes
    C{GET /api/v1/health/checks/NAME}  one check with its details (the
                                  alarms' texts, the store's failure, the
                                  listeners' specs and ports, the disk's free
                                  bytes), C{200} or C{503}: for those who may
                                  read the metrics (L{qmq.core.access.may_monitor})
    C{GET /api/v1/health/checks/port-listener/PORT}  a listener is bound to
                                  PORT; same rights

The checks (L{CHECKS}), read from the broker at the time of asking:

    C{listeners}  every configured listener is bound (the service's
                  L{qmq.service.Listener}s, C{broker.listeners}; a broker
                  with none, in a test or a tool, passes)
    C{store}      the store can write (its C{failure} is None)
    C{alarms}     no alarm holds publishers (the core's admission:
                  the memory alarm, the disk alarm, a store that failed)

A check is a function of the broker alone (L{run_check}), so the unit tests
give it fakes; the handlers are a mixin of the API resource
(L{HealthHandlers}), routed from its table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer

from qmq.core.admission import RETRY_AFTER

__all__ = ["CHECKS", "HealthHandlers", "readiness", "run_check"]


def _listeners(broker: Any) -> tuple[bool, dict[str, Any]]:
    rows = [
        {"protocol": lst.protocol, "spec": lst.spec, "port": _port_number(lst), "listening": lst.port is not None}
        for lst in list(getattr(broker, "listeners", ()) or ())
    ]
    return all(r["listening"] for r in rows), {"listeners": rows}


def _store(broker: Any) -> tuple[bool, dict[str, Any]]:
    failure = getattr(broker.store, "failure", None)
    return failure is None, {"failure": failure}


def _alarms(broker: Any) -> tuple[bool, dict[str, Any]]:
    holds = broker.admission.holds
    details: dict[str, Any] = {
        "alarms": [{"name": h.name, "detail": h.detail, "persistent_only": h.persistent_only} for h in holds]
    }
    disk = getattr(broker, "disk_alarm", None)
    if disk is not None:
        details["disk"] = {"free_bytes": disk.free, "limit_bytes": disk.limit}
    return not holds, details


#: The readiness checks by name: each gives (passes, details).
CHECKS: dict[str, Callable[[Any], tuple[bool, dict[str, Any]]]] = {
    "listeners": _listeners,
    "store": _store,
    "alarms": _alarms,
}


def _port_number(listener: Any) -> int | None:
    port = listener.port
    if port is None:
        return None
    return getattr(port.getHost(), "port", None)


def run_check(broker: Any, name: str) -> tuple[bool, dict[str, Any]]:
    """Run the check C{name} of L{CHECKS} on C{broker}.

    @return: whether it passes, and its details (for monitors only).
    @raise KeyError: no such check.
    """
    return CHECKS[name](broker)


def readiness(broker: Any) -> tuple[bool, dict[str, Any]]:
    """The readiness answer's body, as anyone may read it: each check's
    name and whether it passes, and the names of the alarms that hold.

    @return: whether every check passes, and the body.
    """
    checks: dict[str, Any] = {}
    for name in CHECKS:
        ok, _ = run_check(broker, name)
        checks[name] = {"ok": ok}
    checks["alarms"]["alarms"] = [h.name for h in broker.admission.holds]
    ready = all(c["ok"] for c in checks.values())
    return ready, {"status": "ok" if ready else "failing", "checks": checks}


def _answer(body: dict[str, Any], ok: bool) -> Any:
    from qmq.web.api.resource import json_response  # noqa: PLC0415 - the resource imports this module

    response = json_response(body, 200 if ok else 503)
    if not ok:
        response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


class HealthHandlers:
    """The health endpoints, mixed into L{qmq.web.api.resource.ApiResource}
    (which gives C{broker}, C{monitor_check} and the routes)."""

    broker: Any

    def h_health_live(self, request: Any) -> Any:
        """Liveness: the process answers its HTTP listener."""
        return _answer({"status": "ok"}, True)

    def h_health_ready(self, request: Any) -> Any:
        """Readiness (see the module docstring); anyone may ask."""
        ready, body = readiness(self.broker)
        return _answer(body, ready)

    h_health = h_health_ready

    def h_health_check(self, request: Any, check: str) -> Any:
        """One check, with its details, for a monitor or an admin."""
        from qmq.web.api.problem import Problem  # noqa: PLC0415

        if check not in CHECKS:
            raise Problem(404, "not-found", f"No health check {check!r}; there are {', '.join(CHECKS)}.")

        def answer(_: object) -> Any:
            ok, details = run_check(self.broker, check)
            return _answer({"check": check, "ok": ok, **details}, ok)

        return self.monitor_check(request).addCallback(answer)  # type: ignore[attr-defined]

    def h_health_port(self, request: Any, port: str) -> Any:
        """Whether a configured listener is bound to C{port}, for a monitor
        or an admin."""
        from qmq.web.api.problem import bad_request  # noqa: PLC0415

        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise bad_request(f"{port!r} is not a port number (1 to 65535)")
        number = int(port)

        def answer(_: object) -> Any:
            _, details = _listeners(self.broker)
            bound = [r for r in details["listeners"] if r["port"] == number]
            ok = bool(bound)
            return _answer({"check": "port-listener", "port": number, "ok": ok, "listeners": bound}, ok)

        d: defer.Deferred = self.monitor_check(request)  # type: ignore[attr-defined]
        return d.addCallback(answer)
