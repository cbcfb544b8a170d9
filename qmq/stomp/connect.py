# -*- test-case-name: tests.test_stomp_session,tests.test_auth_session -*-
"""A STOMP session's connection life: CONNECT, login, heart-beats, deadlines.

L{ConnectMixin} is the part of L{qmq.stomp.session.StompSession} that runs
once per connection or on timers, never per message:

    CONNECT/STOMP frame -> version negotiation (or ERROR + close)
      -> authentication on: credentials -> L{qmq.auth.Authenticator}
         (the client's later frames wait, unread, in C{_held}) ->
         the user's virtual host, a timer for its credentials' expiry
      -> L{ConnectMixin._connected}: heart-beats negotiated, the
         L{qmq.stomp.destinations.DestinationChannel} opened, CONNECTED
    timers: heart-beats out (C{_send_tick}), heart-beats in
      (C{_recv_tick}), idle and unfinished-frame deadlines (C{_watch}), the
      CONNECT deadline; all stopped by C{_stop_timers} when the session ends.

It is a mixin, not a helper object, because the session dispatches frames
to its own methods (C{_HANDLERS} maps C{CONNECT} to C{stomp_CONNECT}) and
its timers are bound methods that read and write the session's own state;
moving them here keeps the per-message code in L{qmq.stomp.session} short
without adding an indirection on any path. The mixin has no state of its
own: every attribute it uses is set in C{StompSession.__init__}.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from qmq import __version__
from qmq.core.broker import DEFAULT_VHOST
from qmq.core.vhost import VirtualHost
from qmq.stomp.destinations import DestinationChannel
from qmq.stomp.encoding import VERSION_INDEX, VERSIONS
from qmq.stomp.errors import StompError
from qmq.stomp.frame import Frame, encode_frame, excerpt
from qmq.stomp.headers import parse_heartbeat

# The session's namespace: operators filter a session's log lines by it,
# whichever module of the session wrote them.
log = Logger(namespace="qmq.stomp.session")


class ConnectMixin:
    """CONNECT, login and the session's timers (see the module docstring)."""

    # Set by StompSession; declared for type checkers.
    settings: Any
    transport: Any
    broker: Any
    clock: Any
    user: Any

    # -- timers ------------------------------------------------------------------

    def _watch_interval(self) -> float:
        """How often L{_watch} checks the idle and frame deadlines (0: never)."""
        deadlines = [t for t in (self.settings.idle_timeout, self.settings.frame_timeout) if t]
        return min(deadlines) / 4 if deadlines else 0.0

    def _watch(self) -> None:
        """Close a client that stays silent past C{idle_timeout} whatever it
        negotiated, or leaves a frame unfinished past C{frame_timeout}."""
        if self._blocked:
            return  # we stopped reading it: silence is ours
        now = self._seconds()
        settings = self.settings
        started = self.frame_started
        if settings.frame_timeout and started is not None and now - started >= settings.frame_timeout:
            self.error(
                "frame timeout",
                f"A frame was started but not finished within {settings.frame_timeout:g} s.",
            )
        elif settings.idle_timeout and now - self.last_read >= settings.idle_timeout:
            self.error(
                "idle timeout",
                f"Nothing was received from the client for {settings.idle_timeout:g} s; "
                "send heart-beats to keep a quiet connection open.",
            )

    def _start_heartbeats(self, send_ms: int, recv_ms: int) -> None:
        if send_ms:
            # Ticking at half the interval keeps every gap under the interval.
            self._send_loop = LoopingCall(self._send_tick)
            self._send_loop.clock = self.clock
            self._send_loop.start(send_ms / 2000.0, now=False)
        if recv_ms:
            # Checked every half interval: a client is closed between
            # grace x interval and (grace + 0.5) x interval after its last byte.
            self._recv_deadline = recv_ms * self.settings.heartbeat_grace / 1000.0
            self._recv_loop = LoopingCall(self._recv_tick)
            self._recv_loop.clock = self.clock
            self._recv_loop.start(recv_ms / 2000.0, now=False)

    def _send_tick(self) -> None:
        if not self.wrote and not self._out:
            self.write_frame(b"\n")
        self.wrote = False

    def _recv_tick(self) -> None:
        if self._blocked:
            return  # we stopped reading it: its heart-beats wait in the kernel
        if self._seconds() - self.last_read >= self._recv_deadline:
            self.error(
                "heart-beat timeout",
                "No data or heart-beat from the client within the agreed interval.",
            )

    def _stop_timers(self) -> None:
        for loop in (self._send_loop, self._recv_loop, self._watch_loop):
            if loop is not None and loop.running:
                loop.stop()
        self._send_loop = self._recv_loop = self._watch_loop = None
        for name in ("_connect_timer", "_expiry"):
            timer = getattr(self, name)
            if timer is not None:
                setattr(self, name, None)
                if timer.active():
                    timer.cancel()

    def _connect_timeout(self) -> None:
        self._connect_timer = None
        if not self.connected:
            self.error("connect timeout", "No CONNECT frame within the allowed time.")

    # -- CONNECT ----------------------------------------------------------------------

    def stomp_CONNECT(self, frame: Frame) -> None:
        if self.connected:
            raise StompError("already connected", "CONNECT may be sent only once.")
        h = frame.headers
        accept = h.get("accept-version")
        if accept is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accept.split(",")}
            version = next((v for v in VERSIONS if v in offered), None)
            if version is None:
                self.write_frame(
                    encode_frame(
                        "ERROR",
                        [
                            ("version", ",".join(reversed(VERSIONS))),
                            ("message", "unsupported protocol version"),
                            ("content-type", "text/plain"),
                        ],
                        f"Supported protocol versions are {', '.join(reversed(VERSIONS))}; "
                        f"the client accepts {excerpt(accept)}.".encode(),
                        "1.0",
                    )
                )
                self.flush()
                self.closed = True
                self._stop_timers()
                self.transport.close("unsupported protocol version")
                return
        host = h.get("host")
        auth = self.broker.auth
        if auth is not None:
            self._authenticate(auth, h, version, host or DEFAULT_VHOST)
            return
        vhost = self.broker.vhost(host) if host else None
        if vhost is None:
            if host and self.settings.strict_vhost:
                raise StompError("unknown virtual host", f"There is no virtual host {host!r}.")
            vhost = self.broker.default_vhost
        self._connected(h, version, vhost)

    def _authenticate(self, auth: Any, h: dict[str, str], version: str, name: str) -> None:
        """Check CONNECT's credentials (L{qmq.auth.Authenticator}); the
        client's later frames wait, unread, until it is answered.

        With authentication on, the C{host} header must name a virtual host
        the user may use (no fallback to the default one): a virtual host
        that does not exist gets the same ERROR as one the user may not use.
        """
        credentials = auth.credentials(
            name, h.get("login"), h.get("passcode"), getattr(self.transport, "identity", None)
        )
        self._held = []
        self.transport.pause_reading()
        address = getattr(self.transport, "peer_host", "") or ""
        d = auth.authenticate(name, credentials, address)
        d.addCallbacks(
            self._authenticated,
            self._not_authenticated,
            callbackArgs=(h, version, name),
            errbackArgs=(h.get("receipt"),),
        )

    def _authenticated(self, user: Any, h: dict[str, str], version: str, name: str) -> None:
        if self.closed:
            return
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            # The user was given permissions in a virtual host that was never made.
            self._held = None
            self.transport.resume_reading()
            self.error("access refused", f"Virtual host {name!r} is not open to this user.")
            return
        held, self._held = self._held, None
        self.user = user
        self._connected(h, version, vhost)
        if user.expires is not None:
            self._expiry = self.clock.callLater(
                max(0.0, user.expires - self._seconds()), self._credentials_expired
            )
        if held:
            self.frames_received(held)
        if not self.closed and not self._blocked:
            self.transport.resume_reading()

    def _not_authenticated(self, failure: Failure, receipt: str | None = None) -> None:
        self._held = None
        if self.closed:
            return
        # Reading was paused for the check; a paused TLS connection would
        # not see its peer's side of the close.
        self.transport.resume_reading()
        from qmq.auth import login_refusal  # noqa: PLC0415

        refusal = login_refusal(failure, self.id)
        if refusal is not None:
            self.error(refusal.short, refusal.message, receipt)
        else:
            self.error("internal error", "The broker failed to check the credentials; see its log.")

    def _credentials_expired(self) -> None:
        self._expiry = None
        self.error(
            "token expired",
            "The token this connection logged in with has expired; connect again with a new one.",
        )

    def _connected(self, h: dict[str, str], version: str, vhost: VirtualHost) -> None:
        """CONNECT accepted: negotiate, open the channel, answer CONNECTED."""
        cx = cy = 0
        beat = h.get("heart-beat")
        if beat is not None and version != "1.0":
            cx, cy = parse_heartbeat(beat)
        settings = self.settings
        sx = settings.heartbeat_send_ms if self.heartbeats_supported else 0
        sy = settings.heartbeat_receive_ms if self.heartbeats_supported else 0
        send_ms = max(sx, cy) if (sx and cy) else 0
        recv_ms = max(sy, cx) if (sy and cx) else 0
        self.version = version
        self.version_index = VERSION_INDEX[version]
        self.vhost = vhost
        self.login = h.get("login")
        self.client_id = h.get("client-id")
        self.channel = DestinationChannel(
            self.broker,
            vhost,
            self._owner_name(),
            backlog_budget=self.settings.topic_backlog,
            user=self.user,
            protocol=getattr(self.transport, "traffic_name", "stomp"),
        )
        self.connected = True
        if self._connect_timer is not None and self._connect_timer.active():
            self._connect_timer.cancel()
        self._connect_timer = None
        headers = [("session", self.id), ("server", f"QMQ/{__version__}")]
        if version != "1.0":
            headers[:0] = [("version", version)]
            headers.append(("heart-beat", f"{sx},{sy}"))
        self.write_frame(encode_frame("CONNECTED", headers, b"", version))
        self._start_heartbeats(send_ms, recv_ms)
        # A line per connection: debug, as their open and close are.
        log.debug(
            "stomp connect session={session} peer={peer} version={version} vhost={vhost} "
            "login={login} user={user} heart-beat={send}/{recv}",
            session=self.id,
            peer=self.peer,
            version=version,
            vhost=vhost.name,
            login=self.login,
            user=self.user.name if self.user is not None else None,
            send=send_ms,
            recv=recv_ms,
        )

    def _owner_name(self) -> Any:
        """Who the client is, for what it owns (durable subscriptions): its
        login, else its verified TLS identity, else C{""} (anonymous).

        With authentication on, the authenticated user's owner
        (L{qmq.auth.User.owner}: a token's subject owns apart from the
        password user of the same name); without it the login is not
        checked.
        """
        if self.user is not None:
            return self.user.owner
        if self.login:
            return self.login
        identity = self.transport.identity
        if identity is not None:
            return identity.common_name or identity.subject or identity.fingerprint
        return ""
