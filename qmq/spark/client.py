# -*- test-case-name: tests.test_spark -*-
"""A small blocking client of QMQ's HTTP API, for Spark's driver and workers.

Spark calls data sources from plain threads and Python worker processes,
not from a reactor, so this is C{http.client} with one keep-alive
connection per client (made on first use: a client is picklable until
then). It speaks Avro where messages are carried (range scans, batch
publishes: no base64, no JSON parsing of bodies) and JSON otherwise.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import fastavro

AVRO = "avro/binary"

_SCHEMAS: dict[str, Any] = {}


def project_schema(name: str) -> Any:
    """One of the project's Avro schemas (C{qmq/web/api/schemas/NAME.avsc}),
    parsed."""
    found = _SCHEMAS.get(name)
    if found is None:
        import os  # noqa: PLC0415

        import qmq.web.api as api  # noqa: PLC0415

        path = os.path.join(os.path.dirname(api.__file__), "schemas", name + ".avsc")
        with open(path, encoding="utf-8") as f:
            found = _SCHEMAS[name] = fastavro.parse_schema(json.load(f))
    return found


class ApiError(Exception):
    """The API answered an error (C{status}, and the problem document)."""

    def __init__(self, status: int, doc: Any, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {doc}")
        self.status = status
        self.doc = doc


class Client:
    """A client of one broker's HTTP API.

    @param url: the listener (C{http://127.0.0.1:8080}) or its API root
        (C{.../api/v1}).
    """

    def __init__(self, url: str, user: str | None = None, password: str | None = None,
                 token: str | None = None, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the url must be http:// or https://, not {url!r}")
        self.scheme = parts.scheme
        self.netloc = parts.netloc
        root = parts.path.rstrip("/")
        if not root.endswith("/api/v1"):
            root += "/api/v1"
        self.root = root
        self.timeout = timeout
        self.auth: str | None = None
        if token:
            self.auth = "Bearer " + token
        elif user is not None:
            pair = f"{user}:{password or ''}".encode()
            self.auth = "Basic " + base64.b64encode(pair).decode()
        self._conn: http.client.HTTPConnection | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_conn"] = None
        return state

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            self._conn = kind(self.netloc, timeout=self.timeout)
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, what: str = "") -> tuple[int, dict, bytes]:
        """One request; a connection the server closed meanwhile is made
        again once (idempotent requests only: GET, and publishes whose
        messages carry dedup ids)."""
        hdrs = dict(headers or {})
        if self.auth:
            hdrs["Authorization"] = self.auth
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, self.root + path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
                continue
            if resp.getheader("connection", "").lower() == "close":
                self.close()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, what: str, doc: Any = None) -> Any:
        body = None if doc is None else json.dumps(doc).encode()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        status, _, data = self.request(method, path, body, headers)
        parsed = json.loads(data) if data else None
        if status >= 300:
            raise ApiError(status, parsed, what)
        return parsed

    # -- management ---------------------------------------------------------------

    def queues(self, vhost: str, prefix: str | None = None) -> list[dict]:
        """Every queue of C{vhost} (all pages)."""
        found: list[dict] = []
        offset: int | None = 0
        while offset is not None:
            q = {"offset": offset}
            if prefix:
                q["prefix"] = prefix  # type: ignore[assignment]
            doc = self._json("GET", f"/vhosts/{quote(vhost, safe='')}/queues?{urlencode(q)}",
                             "listing queues")
            found.extend(doc["queues"])
            offset = doc.get("next_offset")
        return found

    def declare_queue(self, vhost: str, queue: str, arguments: dict | None = None) -> dict:
        doc = {"arguments": arguments} if arguments else {}
        return self._json(  # type: ignore[no-any-return]
            "PUT", f"/vhosts/{quote(vhost, safe='')}/queues/{quote(queue, safe='')}",
            f"declaring {queue!r}", doc)

    # -- messages -----------------------------------------------------------------

    def scan(self, vhost: str, queue: str, start: float, end: float, cursor: str | None,
             limit: int = 1000) -> tuple[list[dict], str | None]:
        """One page of a range scan, in Avro: C{Delivery} records (dicts) and
        the next cursor (None: the range is done)."""
        q: dict[str, Any] = {"start": repr(float(start)), "end": repr(float(end)), "limit": limit}
        if cursor is not None:
            q["cursor"] = cursor
        path = f"/vhosts/{quote(vhost, safe='')}/queues/{quote(queue, safe='')}/scan?{urlencode(q)}"
        status, headers, data = self.request("GET", path, None, {"Accept": AVRO})
        if status != 200:
            raise ApiError(status, _problem(data), f"scanning {queue!r}")
        records = list(fastavro.reader(io.BytesIO(data))) if data else []
        return records, headers.get("qmq-next-cursor")

    def publish(self, vhost: str, messages: list[dict], retries: int = 3,
                backoff: float = 0.5) -> dict:
        """Publish a batch (C{PublishMessage} dicts, each with its
        destination) and return the answer once the broker has made it as
        durable as a STOMP receipt. A failed request is retried
        C{retries} times: give the messages dedup ids (C{dedup-id} header)
        and an effectively-once queue drops what a retry repeats."""
        buf = io.BytesIO()
        fastavro.writer(buf, project_schema("PublishMessage"), messages)
        body = buf.getvalue()
        path = f"/vhosts/{quote(vhost, safe='')}/messages"
        headers = {"Content-Type": AVRO, "Accept": "application/json"}
        for attempt in range(retries + 1):
            try:
                status, _, data = self.request("POST", path, body, headers)
            except OSError:
                self.close()
                if attempt == retries:
                    raise
                time.sleep(backoff * (attempt + 1))
                continue
            if status == 201:
                return json.loads(data)  # type: ignore[no-any-return]
            if status < 500 and status != 429 or attempt == retries:
                raise ApiError(status, _problem(data), f"publishing {len(messages)} message(s)")
            time.sleep(backoff * (attempt + 1))
        raise AssertionError("unreachable")


def _problem(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data[:200]


def cursor_after(message_id: int) -> str:
    """The range-scan cursor that resumes after C{message_id} (docs/storage.rst:
    ``"i"`` and the id in hex)."""
    return f"i{message_id:x}"
