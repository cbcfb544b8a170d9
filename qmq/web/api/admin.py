# -*- test-case-name: tests.test_web_api,tests.test_auth -*-
"""The HTTP API's administration handlers: connections, users, permissions.

L{AdminMixin} is the part of L{qmq.web.api.resource.ApiResource} that
only an administrator calls (C{http_api.admins}; each handler starts with
C{_require_admin} or C{_auth}, which checks it):

    /api/v1/connections -> the broker's connection registry: list, close
    /api/v1/links -> the mesh's links to other nodes (L{qmq.cluster.mesh})
    /api/v1/users -> the authenticator's users (L{qmq.auth}): list, show,
      create or change (a password is hashed in a thread), delete (the
      user's open connections close, as RabbitMQ does)
    /api/v1/permissions -> a user's patterns per virtual host; a change
      is pushed to the user's open channels at once
      (L{AdminMixin._refresh_sessions}: every frontend's channel, whatever
      its protocol)

With authentication off there are no users: lists are empty and a change
is a 409 problem.

It is a mixin because the resource dispatches a route to its handler by
name (C{h_<route name>}, the table that the OpenAPI document is checked
against). Connection ids are the registry's (L{qmq.connections.ConnectionIds});
in a mesh a listing holds every node's connections, each id naming its
node (C{ID@NODE}), and a close goes to that node (L{qmq.cluster.manage}).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from qmq.connections import ConnectionIds, connection_row, connection_rows, session_of
from qmq.core import names
from qmq.core.errors import NotFound
from qmq.core.remote import Unavailable
from qmq.web.api.params import Response, _arg, _object_body, json_response
from qmq.web.api.problem import Problem, bad_request
from qmq.web.api.topology import _gaps

if TYPE_CHECKING:
    from twisted.web.server import Request

# The API's namespace: operators filter its log lines by it, whichever of
# its modules wrote them.
log = Logger(namespace="qmq.web.api.resource")

#: Most characters of a user name.
MAX_USER_NAME = 128


class AdminMixin:
    """Connections, users and permissions (see the module docstring)."""

    # Set by ApiResource; declared for type checkers.
    ctx: Any
    broker: Any
    settings: Any

    # -- connections ------------------------------------------------------------------

    def _registry(self) -> Any:
        registry = getattr(self.ctx, "connections", None)
        if registry is None:
            raise Problem(404, "not-found", "This broker keeps no connection registry.")
        return registry

    def _ids(self, registry: Any) -> ConnectionIds:
        """The ids of C{registry}'s connections (shared by every site of
        this node and the other nodes' requests)."""
        ids = getattr(registry, "ids", None)
        if ids is None:
            ids = self.__dict__.setdefault("_own_ids", ConnectionIds())
        return ids  # type: ignore[no-any-return]

    def h_list_connections(self, request: Request) -> Any:
        self._require_admin(request)
        registry = self._registry()
        manage = self._manage()  # type: ignore[attr-defined]
        if manage is not None:
            # The whole broker: each node's connections, in node order, each
            # id naming its node (ID@NODE) and the node named.
            def merged(result: tuple[dict, dict]) -> Response:
                answers, missing = result
                by_node = {manage.mesh.node: connection_rows(registry, self._ids(registry))}
                truncated = []
                for node, answer in answers.items():
                    by_node[node] = answer.get("connections") or []
                    if answer.get("truncated"):
                        truncated.append(node)
                rows = [{**row, "id": f"{row['id']}@{node}", "node": node}
                        for node in sorted(by_node) for row in by_node[node]]
                page, meta = self._page(request, rows, len(rows))  # type: ignore[attr-defined]
                return json_response({"connections": page, **meta, **_gaps(missing, truncated)})

            return manage.ask_all("connections", {}).addCallback(merged)
        conns = list(registry.connections())
        page, meta = self._page(request, conns, len(conns))  # type: ignore[attr-defined]
        return json_response({"connections": [connection_row(conn, self._ids(registry)) for conn in page], **meta})

    def h_list_links(self, request: Request) -> Response:
        """This node's links to the other nodes of its mesh, with their
        counters (an empty list without a mesh)."""
        self._require_admin(request)
        mesh = getattr(self.broker, "mesh", None)
        links = mesh.snapshot() if mesh is not None else []
        return json_response({"node": self.broker.node, "links": links})

    def h_close_connection(self, request: Request, connection: str) -> Any:
        self._require_admin(request)
        registry = self._registry()
        cid, _, node = connection.partition("@")
        mesh = getattr(self.broker, "mesh", None)
        if node and mesh is not None and node != mesh.node:
            # Another node's (ID@NODE, from a whole-broker listing): closed there.
            def refused(failure: Any) -> Any:
                if failure.check(NotFound) and not failure.check(Unavailable):
                    raise Problem(404, "unknown-connection", f"No connection {connection[:60]!r}; list them first.")
                return failure

            d = mesh.manage.ask(node, "connection.close", {"id": cid})
            return d.addCallbacks(lambda _: json_response({"closed": connection}), refused)
        conn = self._ids(registry).find(cid) if not node or (mesh is not None and node == mesh.node) else None
        if conn is None or conn not in registry.connections():
            raise Problem(404, "unknown-connection", f"No connection {connection[:40]!r}; list them first.")
        conn.shutdown("closed by an administrator (HTTP API)")
        return json_response({"closed": connection})

    # -- users and permissions -----------------------------------------------------------

    def _auth(self, request: Request, changing: bool = False) -> Any:
        """The broker's authenticator, for an admin's request. Without one
        (authentication off) a change is a 409: there is no user to change."""
        self._require_admin(request)
        auth = getattr(self.broker, "auth", None)
        if auth is None and changing:
            raise Problem(
                409,
                "authentication-off",
                "Authentication is off (no [users] and no token key configured), so there are no users to "
                "change; configure one user to turn it on (see docs/security.rst).",
            )
        return auth

    def _user_doc(self, auth: Any, name: str) -> dict:
        u = auth.users[name]
        return {
            "name": name,
            "password": u.password is not None,
            "certificate_names": list(u.certificate_names),
            "source": auth.user_sources.get(name, "config"),
            "admin": name in self.settings.admins.split(),
        }

    @staticmethod
    def _user_name(name: str) -> str:
        # The core's rule for every name (no control character, valid
        # Unicode), within the API's length: one the OpenAPI document can state.
        if not name or len(name) > MAX_USER_NAME:
            raise bad_request(f"a user name is 1 to {MAX_USER_NAME} characters")
        reason = names.problem("user name", name, limit=0)
        if reason is not None:
            raise bad_request(reason, "invalid-name")
        return name

    def h_list_users(self, request: Request) -> Response:
        auth = self._auth(request)
        names = sorted(auth.users) if auth is not None else []
        page, meta = self._page(request, names, len(names))
        return json_response({"users": [self._user_doc(auth, n) for n in page], **meta})

    def _known_user(self, auth: Any, name: str) -> None:
        if auth is None or name not in auth.users:
            raise Problem(404, "unknown-user", f"No user {name[:MAX_USER_NAME]!r}.")

    def h_get_user(self, request: Request, user: str) -> Response:
        auth = self._auth(request)
        self._known_user(auth, user)
        return json_response(self._user_doc(auth, user))

    def h_put_user(self, request: Request, user: str) -> Any:
        from qmq.auth.passwords import HashError, parse_hash  # noqa: PLC0415

        auth = self._auth(request, changing=True)
        name = self._user_name(user)
        doc = _object_body(
            request, {"password": (str,), "password_hash": (str,), "certificate_names": (list,)}, ()
        )
        if "password" in doc and "password_hash" in doc:
            raise bad_request("give 'password' or 'password_hash', not both")
        certs = doc.get("certificate_names", [])
        if not all(c.__class__ is str and c for c in certs):
            raise bad_request("'certificate_names' must be an array of non-empty strings")
        if "password_hash" in doc:
            try:
                parse_hash(doc["password_hash"])
            except HashError as e:
                raise bad_request(f"'password_hash': {e}") from None
        password = doc.get("password")
        if password is not None and not password:
            raise bad_request("'password' is empty")
        if password is None and "password_hash" not in doc and not certs:
            raise bad_request("a user needs a 'password', a 'password_hash' or 'certificate_names' to log in with")

        def store(hashed: str | None) -> Response:
            try:
                new = auth.set_user(name, hashed, tuple(certs))
            except ValueError as e:
                raise Problem(409, "conflict", str(e)) from None
            log.info("http api: user {user} {what} by {admin}", user=name, what="created" if new else "changed",
                     admin=self._who(request))
            return json_response(self._user_doc(auth, name), 201 if new else 200)

        if password is None:
            return store(doc.get("password_hash"))
        # scrypt costs 0.1-0.3 s of CPU: in a thread, as a login's check is.
        return auth.passwords.hash(password).addCallback(store)

    def _refresh_sessions(self, auth: Any, name: str) -> int:
        """Give the open sessions of user C{name} (every protocol's channel
        into the core) its permissions as they are now: the next
        destination they name is checked against them (send targets
        resolved before are forgotten). @return: how many channels."""
        traffic = getattr(self.broker, "traffic", None)
        done = 0
        for channel in list(traffic.live) if traffic is not None else ():
            user = channel.user
            if user is not None and user.account == name:
                fresh = auth.refreshed(user)
                if fresh is not None:
                    channel.set_user(fresh)
                    done += 1
        return done

    @staticmethod
    def _who(request: Request) -> str:
        user = getattr(request, "qmq_user", None)
        return user.name if user is not None else "(no authentication)"

    def h_delete_user(self, request: Request, user: str) -> Response:
        auth = self._auth(request, changing=True)
        self._known_user(auth, user)
        auth.delete_user(user)
        closed = 0
        registry = getattr(self.ctx, "connections", None)
        if registry is not None:
            # As RabbitMQ does: the deleted user's connections close.
            for conn in list(registry.connections()):
                who = getattr(session_of(conn), "user", None)
                if who is not None and who.account == user:
                    conn.shutdown(f"user {user!r} was deleted by an administrator")
                    closed += 1
        log.info("http api: user {user} deleted by {admin}", user=user, admin=self._who(request))
        return json_response({"deleted": user, "connections_closed": closed})

    @staticmethod
    def _permission_doc(vhost: str, user: str, patterns: tuple[str, str, str]) -> dict:
        return {"vhost": vhost, "user": user, "configure": patterns[0], "write": patterns[1], "read": patterns[2]}

    def h_list_permissions(self, request: Request) -> Response:
        auth = self._auth(request)
        who = _arg(request, "user")
        where = _arg(request, "vhost")
        rows = [
            self._permission_doc(vhost, p.user, (p.configure, p.write, p.read))
            for vhost, p in (auth.permissions() if auth is not None else [])
            if (who is None or p.user == who) and (where is None or vhost == where)
        ]
        page, meta = self._page(request, rows, len(rows))
        return json_response({"permissions": page, **meta})

    def h_get_permission(self, request: Request, vhost: str, user: str) -> Response:
        auth = self._auth(request)
        patterns = auth.permission(vhost, user) if auth is not None else None
        if patterns is None:
            raise Problem(404, "unknown-permission", f"User {user[:MAX_USER_NAME]!r} has no permissions in "
                          f"virtual host {vhost!r}.")
        return json_response(self._permission_doc(vhost, user, patterns))

    def h_put_permission(self, request: Request, vhost: str, user: str) -> Response:
        import re  # noqa: PLC0415

        auth = self._auth(request, changing=True)
        self._vhost(vhost)
        self._known_user(auth, user)
        doc = _object_body(request, {"configure": (str,), "write": (str,), "read": (str,)}, ())
        patterns = (doc.get("configure", ""), doc.get("write", ""), doc.get("read", ""))
        try:
            new = auth.set_permission(vhost, user, *patterns)
        except re.error as e:
            raise bad_request(f"a pattern is not a regular expression: {e}") from None
        self._refresh_sessions(auth, user)
        log.info("http api: permissions of {user} in {vhost} set to {patterns} by {admin}", user=user,
                 vhost=vhost, patterns=patterns, admin=self._who(request))
        return json_response(self._permission_doc(vhost, user, patterns), 201 if new else 200)

    def h_delete_permission(self, request: Request, vhost: str, user: str) -> Response:
        auth = self._auth(request, changing=True)
        if not auth.clear_permission(vhost, user):
            raise Problem(404, "unknown-permission", f"User {user[:MAX_USER_NAME]!r} has no permissions in "
                          f"virtual host {vhost!r}.")
        self._refresh_sessions(auth, user)
        log.info("http api: permissions of {user} in {vhost} removed by {admin}", user=user, vhost=vhost,
                 admin=self._who(request))
        return json_response({"deleted": {"vhost": vhost, "user": user}})
