# -*- test-case-name: tests.test_ctl,tests.integration.test_ctl -*-
"""C{qmq-ctl}: manage a running broker over its HTTP API.

A synchronous command-line client (the standard library's
L{urllib.request}, no reactor): each command is one or a few requests to
C{/api/v1} of an C{http:} listener (docs/ctl.rst).  The flow:

    1. L{parser} reads the command line; the credentials may also come from
       the environment (C{QMQ_CTL_USER}, C{QMQ_CTL_PASSWORD},
       C{QMQ_CTL_TOKEN}, C{QMQ_CTL_URL}).
    2. L{Client} makes the requests: HTTP Basic or a bearer token, JSON in
       and out; a list is read page after page (C{next_offset}) up to
       L{MAX_PAGES}.
    3. The answer is printed as a table, or as JSON with C{--json}.

Every failure is one line on standard error and an exit status, never a
traceback: L{EXIT_REFUSED} (the broker answered with a problem: its status,
title and detail), L{EXIT_UNREACHABLE} (no answer: refused, timed out, not
QMQ), L{EXIT_USAGE} (a bad command line, as argparse does), and for
C{health}, L{EXIT_REFUSED} when the broker is not ready.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import http.client
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import IO, Any, NoReturn
from urllib.parse import quote, urlencode, urlsplit

__all__ = ["Client", "CtlError", "main", "main_exit", "parser"]

#: The default broker: the embedded default configuration's http: listener.
DEFAULT_URL = "http://127.0.0.1:15674"

EXIT_OK = 0
#: The broker refused (a 4xx or 5xx problem), or is not ready (C{health}).
EXIT_REFUSED = 1
#: A bad command line.
EXIT_USAGE = 2
#: No usable answer: the broker cannot be reached, or is not QMQ.
EXIT_UNREACHABLE = 3

#: Most pages one listing reads (each up to the broker's http_api.max_list).
MAX_PAGES = 1000

#: The columns of each listing's table.
COLUMNS: dict[str, tuple[str, ...]] = {
    "queues": ("name", "messages_ready", "messages_unacknowledged", "consumers", "durable", "auto_delete"),
    "exchanges": ("name", "type", "durable", "auto_delete", "internal", "bindings"),
    "bindings": ("exchange", "queue", "routing_key"),
    "connections": ("id", "protocol", "peer", "user"),
    "users": ("name", "password", "certificate_names", "source", "admin"),
    "vhosts": ("name", "queues", "exchanges"),
    "permissions": ("vhost", "user", "configure", "write", "read"),
    "links": ("node", "direction", "state", "rtt_ms", "messages_out", "messages_in", "dropped"),
}


class CtlError(Exception):
    """A failure to report: C{message} on standard error, C{status} the exit status."""

    def __init__(self, message: str, status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Client:
    """
    The HTTP API of one broker.

    @ivar url: the listener's base URL (C{http://127.0.0.1:15674}).
    """

    def __init__(
        self,
        url: str,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        #: Nodes a whole-broker listing lacked: node -> why (L{pages}).
        self.missing: dict[str, str] = {}
        if urlsplit(self.url).scheme not in ("http", "https") or not urlsplit(self.url).netloc:
            raise CtlError(f"--url {url!r}: expected http://HOST:PORT or https://HOST:PORT", EXIT_USAGE)
        self.timeout = timeout
        self.context = context
        self.authorization: str | None = None
        if token:
            self.authorization = f"Bearer {token}"
        elif user is not None:
            pair = f"{user}:{password or ''}".encode()
            self.authorization = "Basic " + base64.b64encode(pair).decode()

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        """
        One request; the answer's JSON.

        @param path: under the base URL (C{/api/v1/...}), already quoted.
        @raise CtlError: a problem answer, or no usable answer.
        """
        url = self.url + path + (("?" + urlencode(query)) if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.authorization:
            headers["Authorization"] = self.authorization
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, _read(e)
            if status == 503 and path.startswith("/api/v1/health"):
                return _json(raw, url, status)
            raise CtlError(_problem_text(status, e.reason, raw), EXIT_REFUSED) from None
        except urllib.error.URLError as e:
            raise CtlError(f"cannot reach {self.url}: {e.reason}", EXIT_UNREACHABLE) from None
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            raise CtlError(f"cannot reach {self.url}: {e or type(e).__name__}", EXIT_UNREACHABLE) from None
        return _json(raw, url, status)

    def pages(self, path: str, key: str, query: dict[str, Any] | None = None) -> list[Any]:
        """Every item of a listing, page after page (at most L{MAX_PAGES})."""
        items: list[Any] = []
        offset: int | None = 0
        for _ in range(MAX_PAGES):
            doc = self.request("GET", path, query={**(query or {}), "offset": offset} if offset else query)
            if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
                raise CtlError(f"unexpected answer from {self.url}{path}: no {key!r} list", EXIT_UNREACHABLE)
            # A whole-broker listing (workers, a mesh) names the nodes it lacks.
            if isinstance(doc.get("missing"), dict):
                self.missing.update(doc["missing"])
            items.extend(doc[key])
            offset = doc.get("next_offset")
            if not offset:
                return items
        raise CtlError(f"{path}: more than {MAX_PAGES} pages; stopped", EXIT_REFUSED)


def _read(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read()
    except OSError:
        return b""


def _json(raw: bytes, url: str, status: int) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise CtlError(f"unexpected answer from {url} (status {status}, not JSON): is it a QMQ http: listener?",
                       EXIT_UNREACHABLE) from None


def _problem_text(status: int, reason: str, raw: bytes) -> str:
    """An RFC 9457 problem (or any error body) as one line."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        title = doc.get("title") or reason
        detail = doc.get("detail") or doc.get("error") or ""
        item = doc.get("item")
        text = f"{status} {title}: {detail}" if detail else f"{status} {title}"
        return text + (f" (item: {item})" if item and str(item) not in text else "")
    return f"{status} {reason}"


# -- output ---------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if value is None:
        return ""
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as a text table with a header, columns padded."""
    cells = [list(columns)] + [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


# -- the commands -------------------------------------------------------------------------


def _vh(name: str) -> str:
    return quote(name, safe="")


def _out(args: argparse.Namespace, doc: Any, text: str, out: IO[str]) -> None:
    out.write(json.dumps(doc, indent=2) + "\n" if args.json else text)


#: Columns a whole-broker listing adds (workers, a mesh): the node of each row.
NODE_COLUMNS = {"queues": "home", "bindings": "home", "connections": "node"}


def cmd_list(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str] | None = None) -> int:
    what = args.what
    vh = _vh(args.vhost)
    path = {
        "queues": f"/api/v1/vhosts/{vh}/queues",
        "exchanges": f"/api/v1/vhosts/{vh}/exchanges",
        "bindings": f"/api/v1/vhosts/{vh}/bindings",
        "connections": "/api/v1/connections",
        "users": "/api/v1/users",
        "permissions": "/api/v1/permissions",
    }.get(what)
    if what in ("vhosts", "links"):
        # Not paged: every virtual host, every link of this node's mesh.
        doc = client.request("GET", f"/api/v1/{what}")
        rows = doc.get(what, []) if isinstance(doc, dict) else []
    else:
        rows = client.pages(path, what)
    columns = COLUMNS[what]
    extra = NODE_COLUMNS.get(what)
    if extra is not None and any(isinstance(r, dict) and extra in r for r in rows):
        columns = (*columns, extra)
    _out(args, rows, table(rows, columns), out)
    if client.missing:
        # A partial list says so, and the exit status too.
        for node, why in sorted(client.missing.items()):
            (err or sys.stderr).write(f"qmq-ctl: node {node} did not answer ({why}): its {what} are not listed\n")
        return EXIT_UNREACHABLE
    return EXIT_OK


def cmd_purge(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    doc = client.request("DELETE", f"/api/v1/vhosts/{_vh(args.vhost)}/queues/{_vh(args.name)}/messages")
    _out(args, doc, f"purged {doc.get('purged', 0)} message(s) from queue {args.name!r}\n", out)
    return EXIT_OK


def cmd_delete(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    if args.what == "queue":
        doc = client.request("DELETE", f"/api/v1/vhosts/{_vh(args.vhost)}/queues/{_vh(args.name)}")
        text = f"deleted queue {args.name!r} with {doc.get('messages', 0)} message(s)\n"
    else:
        doc = client.request("DELETE", f"/api/v1/users/{_vh(args.name)}")
        text = f"deleted user {args.name!r}; {doc.get('connections_closed', 0)} connection(s) closed\n"
    _out(args, doc, text, out)
    return EXIT_OK


def cmd_close(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    doc = client.request("DELETE", f"/api/v1/connections/{_vh(args.id)}")
    _out(args, doc, f"closed connection {args.id}\n", out)
    return EXIT_OK


def cmd_add_user(client: Client, args: argparse.Namespace, out: IO[str], stdin: IO[str]) -> int:
    body: dict[str, Any] = {}
    password = args.password_value
    if password == "-":
        password = stdin.readline().rstrip("\r\n")
    if password is not None:
        body["password"] = password
    if args.password_hash is not None:
        body["password_hash"] = args.password_hash
    if args.certificate_name:
        body["certificate_names"] = args.certificate_name
    if not body:
        raise CtlError("add user: give a PASSWORD ('-' reads it from standard input), --password-hash or "
                       "--certificate-name", EXIT_USAGE)
    doc = client.request("PUT", f"/api/v1/users/{_vh(args.name)}", body)
    _out(args, doc, f"user {args.name!r} saved\n", out)
    return EXIT_OK


def cmd_set_permissions(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    doc = client.request("PUT", f"/api/v1/permissions/{_vh(args.vhost)}/{_vh(args.user_name)}", body)
    _out(args, doc, table([doc], COLUMNS["permissions"]), out)
    return EXIT_OK


def cmd_export(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str] | None = None) -> int:
    doc = client.request("GET", "/api/v1/definitions")
    text = json.dumps(doc, indent=2) + "\n"
    if args.file and args.file != "-":
        try:
            with open(args.file, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise CtlError(f"cannot write {args.file}: {e.strerror or e}", EXIT_REFUSED) from None
        counts = ", ".join(f"{len(doc.get(k, []))} {k}" for k in ("users", "exchanges", "queues", "bindings"))
        (err or sys.stderr).write(f"exported {counts} to {args.file}\n")
    else:
        out.write(text)
    missing = doc.get("missing") if isinstance(doc, dict) else None
    if missing and isinstance(missing, dict):
        # A partial export (workers, a mesh) says so, and the exit status too.
        for node, why in sorted(missing.items()):
            (err or sys.stderr).write(f"qmq-ctl: node {node} did not answer ({why}): its queues are not exported\n")
        return EXIT_UNREACHABLE
    return EXIT_OK


def cmd_import(client: Client, args: argparse.Namespace, out: IO[str], stdin: IO[str]) -> int:
    try:
        if args.file == "-":
            text = stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise CtlError(f"cannot read {args.file}: {e.strerror or e}", EXIT_REFUSED) from None
    except UnicodeDecodeError:
        raise CtlError(f"{args.file}: not UTF-8 text", EXIT_REFUSED) from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CtlError(f"{args.file}: not JSON: {e}", EXIT_REFUSED) from None
    result = client.request("POST", "/api/v1/definitions", doc)
    created = result.get("created", {}) if isinstance(result, dict) else {}
    unchanged = result.get("unchanged", {}) if isinstance(result, dict) else {}
    rows = [{"kind": k, "created": created.get(k, 0), "unchanged": unchanged.get(k, 0)} for k in created]
    _out(args, result, table(rows, ("kind", "created", "unchanged")), out)
    return EXIT_OK


def cmd_health(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    doc = client.request("GET", "/api/v1/health/ready")
    if not isinstance(doc, dict):
        raise CtlError(f"unexpected answer from {client.url}/api/v1/health/ready", EXIT_UNREACHABLE)
    checks = doc.get("checks", {})
    rows = [{"check": name, "ok": c.get("ok"), "alarms": c.get("alarms", "")} for name, c in checks.items()]
    _out(args, doc, f"status: {doc.get('status')}\n" + table(rows, ("check", "ok", "alarms")), out)
    return EXIT_OK if doc.get("status") == "ok" else EXIT_REFUSED


# -- the command line -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def parser() -> argparse.ArgumentParser:
    """The command line of C{qmq-ctl}."""
    env = os.environ
    p = _Parser(
        prog="qmq-ctl",
        description="Manage a running QMQ broker over its HTTP API (docs/ctl.rst).",
        epilog="Exit status: 0 done; 1 the broker refused (or, for health, is not ready); 2 a bad command "
        "line; 3 the broker cannot be reached.",
    )
    p.add_argument("--url", default=env.get("QMQ_CTL_URL", DEFAULT_URL),
                   help=f"the broker's http: listener (env QMQ_CTL_URL; default {DEFAULT_URL})")
    p.add_argument("--user", "-u", default=env.get("QMQ_CTL_USER"), help="user name (env QMQ_CTL_USER)")
    p.add_argument("--password", "-p", default=env.get("QMQ_CTL_PASSWORD"),
                   help="password (env QMQ_CTL_PASSWORD; asked for on a terminal if --user is given without one)")
    p.add_argument("--token", default=env.get("QMQ_CTL_TOKEN"), help="a bearer token instead (env QMQ_CTL_TOKEN)")
    p.add_argument("--vhost", default="/", help="the virtual host (default /)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer (default 30)")
    p.add_argument("--cacert", help="CA certificates (PEM) to verify an https:// broker with")
    # --json and --vhost also after the command (qmq-ctl list queues --json).
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--vhost", default=argparse.SUPPRESS, help="the virtual host")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help)

    ls = command("list", "list queues, exchanges, bindings, connections, users, vhosts, permissions or links")
    ls.add_argument("what", choices=tuple(COLUMNS))
    purge = command("purge", "purge queue NAME: drop its ready messages")
    purge.add_argument("kind", choices=("queue",))
    purge.add_argument("name")
    delete = command("delete", "delete queue NAME, or delete user NAME")
    delete.add_argument("what", choices=("queue", "user"))
    delete.add_argument("name")
    close = command("close", "close connection ID (from list connections)")
    close.add_argument("kind", choices=("connection",))
    close.add_argument("id")
    add = command("add", "add user NAME [PASSWORD]: create or change a user")
    add.add_argument("kind", choices=("user",))
    add.add_argument("name")
    add.add_argument("password_value", metavar="PASSWORD", nargs="?",
                     help="its password ('-': read a line from standard input)")
    add.add_argument("--password-hash", help="a hash printed by qmq-passwd instead of a password")
    add.add_argument("--certificate-name", action="append", default=[],
                     help="a name in a client certificate that logs in as this user (repeatable)")
    perms = command("set", "set permissions USER [--configure RE] [--write RE] [--read RE]")
    perms.add_argument("kind", choices=("permissions",))
    perms.add_argument("user_name", metavar="USER")
    for name in ("configure", "write", "read"):
        perms.add_argument(f"--{name}", default="", help=f"{name} pattern (default: nothing)")
    export = command("export", "export definitions [FILE]: users, queues, exchanges... as JSON")
    export.add_argument("kind", choices=("definitions",))
    export.add_argument("file", nargs="?", help="where to write them (default: standard output)")
    imp = command("import", "import definitions FILE ('-': standard input)")
    imp.add_argument("kind", choices=("definitions",))
    imp.add_argument("file")
    command("health", "whether the broker is ready (exit status 1 if not)")
    return p


def main(
    argv: Sequence[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    stdin: IO[str] | None = None,
) -> int:
    """
    Run one command.

    @return: the exit status.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    inp = stdin or sys.stdin
    args = parser().parse_args(argv)
    try:
        password = args.password
        if args.user is not None and password is None and not args.token:
            if not inp.isatty():
                raise CtlError("--user needs --password (or QMQ_CTL_PASSWORD)", EXIT_USAGE)
            password = getpass.getpass(f"password for {args.user}: ")
        context = None
        if args.cacert:
            try:
                context = ssl.create_default_context(cafile=args.cacert)
            except (OSError, ssl.SSLError) as e:
                raise CtlError(f"--cacert {args.cacert}: {e}", EXIT_USAGE) from None
        client = Client(args.url, args.user, password, args.token, args.timeout, context)
        command = args.command
        if command == "list":
            return cmd_list(client, args, out, err)
        if command == "purge":
            return cmd_purge(client, args, out)
        if command == "delete":
            return cmd_delete(client, args, out)
        if command == "close":
            return cmd_close(client, args, out)
        if command == "add":
            return cmd_add_user(client, args, out, inp)
        if command == "set":
            return cmd_set_permissions(client, args, out)
        if command == "export":
            return cmd_export(client, args, out, err)
        if command == "import":
            return cmd_import(client, args, out, inp)
        return cmd_health(client, args, out)
    except CtlError as e:
        err.write(f"qmq-ctl: {e.message}\n")
        return e.status
    except KeyboardInterrupt:
        err.write("qmq-ctl: interrupted\n")
        return 130
    except Exception as e:  # a defect here: still one line, never a traceback
        err.write(f"qmq-ctl: internal error: {type(e).__name__}: {e}\n")
        return EXIT_REFUSED


def main_exit() -> NoReturn:
    """The console script: L{main}'s status as the process's."""
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
