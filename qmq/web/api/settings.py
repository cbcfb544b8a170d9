# -*- test-case-name: tests.test_web_api -*-
"""Settings of the HTTP API: the C{[http_api]} table of the configuration.

L{qmq.config} registers L{ApiSettings} in its C{SECTIONS}; the table's schema
comes from the fields (type annotation and C{metadata}), and the defaults
here are the documented defaults (C{qmq/default.toml} repeats them).
Every buffer the API keeps for a client has a cap here, and every wait a
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ApiSettings:
    """What the HTTP API enforces and offers.

    @ivar max_batch: most messages one publish or receive request carries.
    @ivar max_wait: most seconds a long poll (C{wait}) may wait.
    @ivar default_visibility: seconds a received message stays invisible
        (unacknowledged, kept for its receiver) when the request names none.
    @ivar max_visibility: most seconds a C{visibility} may ask for.
    @ivar max_unacked: most messages received over HTTP and not yet
        acknowledged, per queue; past it a receive gets nothing more.
    @ivar upload_timeout: seconds a request to the web listener may take
        from its first line to the end of its body (a slow upload is
        answered 408 and closed; L{qmq.web.site.QMQRequest}). The body cap
        is C{[web] max_request_body}.
    @ivar follow_backlog: most messages a topic follower (SSE stream or
        cursor) holds for a client that is not reading; the oldest go first.
    @ivar follow_idle_timeout: seconds a cursor follower lives without a poll.
    @ivar max_followers: most topic followers (SSE streams and cursors) open
        at once.
    @ivar sse_keepalive: seconds between keep-alive comments on an idle
        Server-Sent Events stream.
    @ivar cors_origins: origins allowed to call the API from a browser
        (space-separated; C{"*"} allows any); empty: no CORS headers.
    @ivar admins: with authentication on, the users (space-separated names)
        who may list and close connections and list every virtual host.
    @ivar monitors: with authentication on, the users (space-separated
        names) who may read C{/metrics} and the health checks' details
        without being admins (RabbitMQ's C{monitoring} tag); they need no
        permission in any virtual host.
    @ivar auth_cache: seconds a successful login over HTTP is remembered
        (per virtual host and C{Authorization} header), so that a client
        sending the same credentials on every request is not checked (a
        password hash) every time; 0: check every request.
    @ivar max_list: most items one management listing returns.
    @ivar max_metric_queues: most queues C{/metrics} reports one by one.
    """

    max_batch: int = field(default=10_000, metadata={"min": 1})
    max_wait: float = field(default=20.0, metadata={"min": 0})
    default_visibility: float = field(default=30.0, metadata={"above": 0})
    max_visibility: float = field(default=43_200.0, metadata={"above": 0})
    max_unacked: int = field(default=100_000, metadata={"min": 1})
    upload_timeout: float = field(default=30.0, metadata={"above": 0})
    follow_backlog: int = field(default=10_000, metadata={"min": 1})
    follow_idle_timeout: float = field(default=60.0, metadata={"above": 0})
    max_followers: int = field(default=10_000, metadata={"min": 1})
    sse_keepalive: float = field(default=15.0, metadata={"above": 0})
    cors_origins: str = ""
    admins: str = ""
    monitors: str = ""
    auth_cache: float = field(default=30.0, metadata={"min": 0})
    max_list: int = field(default=10_000, metadata={"min": 1})
    max_metric_queues: int = field(default=1_000, metadata={"min": 0})

    def allowed_origins(self) -> frozenset[str]:
        """The CORS origins as a set."""
        return frozenset(self.cors_origins.split())
