# -*- test-case-name: tests.test_web_api_openapi -*-
"""The OpenAPI 3.1 document of C{/api/v1/}, served at C{/api/v1/openapi.json}.

Built here from small helpers so every operation states its parameters,
bodies, every status it answers and the problem documents of its errors.
The tests check that its paths are exactly L{ApiResource.routes} and
validate every response they get against it; a schemathesis run against the
served document finds no 5xx and no response that breaks it.
"""

from __future__ import annotations

from typing import Any

from qmq.core.message import PROPERTY_NAMES
from qmq.core.options import MAX_ACK_TIMEOUT, MAX_EPOCH_MS, MAX_PRIORITY, MAX_SPAN_MS
from qmq.core.policy import QUEUE_ARGUMENTS
from qmq.web.api.codec import MAX_HEADER_TEXT
from qmq.web.api.settings import ApiSettings

PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
AVRO_MEDIA = {"avro/binary": {"schema": {"type": "string", "contentMediaType": "avro/binary"}}}

_REASONS = {
    400: "Bad request: bad JSON or Avro, a bad parameter or field (see detail).",
    401: "Authentication is on and the request has no valid credentials (HTTP Basic or a bearer token).",
    403: "Refused: no permission (with authentication on), the object is the broker's own or a session's, or "
    "the request comes from a page of an origin the broker does not trust ([web] allowed_origins).",
    404: "No such virtual host, queue, exchange or endpoint.",
    405: "Method not allowed here.",
    408: "The request was not received in time (http_api.upload_timeout).",
    409: "Conflicts with what exists (e.g. an exchange of another type), or a change of users while "
    "authentication is off.",
    410: "The cursor's follower is gone; poll without a cursor.",
    413: "The body or the batch is too large ([web] max_request_body, [http_api] max_batch).",
    415: "Unsupported Content-Type (a request that changes something takes JSON, Avro where the endpoint "
    "does, or no body: never what an HTML form sends).",
    421: "The Host header names no name of this broker ([web] allowed_hosts; a DNS rebinding guard).",
    429: "A queue is full (reject-publish), the cap on followers is reached, or too many "
    "failed logins; retry later.",
    503: "Not accepted: publishers are held back (memory or disk alarm), or the store could not keep the messages, "
    "or (in a mesh, with workers) the node that holds the queue or connection is down or did not answer; "
    "retry later (after Retry-After when given).",
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": _REASONS[c], "content": PROBLEM} for c in codes}


def _path_param(name: str, description: str, example: str | None = None) -> dict:
    p = {"name": name, "in": "path", "required": True, "description": description, "schema": {"type": "string"}}
    if example is not None:
        p["example"] = example
    return p


#: A name or key as qmq.core.names accepts it: no control character, at most
#: 255 bytes in UTF-8 (a length in characters is what JSON Schema can say).
NAME = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^\\x00-\\x1f\\x7f]+$"}
#: An exchange's arguments (qmq.core.exchange.alternate_of).
EXCHANGE_ARGUMENTS = {
    "type": "object",
    "description": "alternate-exchange: the exchange that gets what this one routes nowhere (declaring it needs "
    "write there); other arguments are kept and mean nothing.",
    "properties": {"alternate-exchange": {"type": "string", "minLength": 1}},
}

#: An exchange's name also holds no '/' (STOMP's /exchange/NAME/KEY).
EXCHANGE_NAME = {**NAME, "pattern": "^[^\\x00-\\x1f\\x7f/]+$"}
KEY = {**NAME, "minLength": 0, "pattern": "^[^\\x00-\\x1f\\x7f]*$"}
NAME_RULE = " No control character, at most 255 bytes in UTF-8."
#: A header's or property's text: no control character but TAB, LF and CR.
VALUE_PATTERN = "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"


def _named(param: dict, schema: dict) -> dict:
    return {**param, "description": param["description"] + NAME_RULE, "schema": schema}


VHOST = _path_param("vhost", "The virtual host's name, URL-encoded (the default one is %2F).", "/")
QUEUE = _named(_path_param("queue", "The queue's name.", "orders"), NAME)
TOPIC = _named(_path_param("topic", "The routing key (publish) or binding pattern (follow) on amq.topic.",
                           "weather.paris"), NAME)
EXCHANGE = _named(_path_param("exchange", "The exchange's name (no '/').", "amq.topic"), EXCHANGE_NAME)
#: A destination of POST .../messages (the HTTP API publishes to no /temp-queue/ nor /control/).
DESTINATION = {
    "type": "string", "maxLength": 1024,
    "pattern": "^/(queue/[^\\x00-\\x1f\\x7f]+|topic/[^\\x00-\\x1f\\x7f]+|exchange/[^\\x00-\\x1f\\x7f/]+"
               "(/[^\\x00-\\x1f\\x7f]*)?)$",
    "description": "/queue/NAME, /topic/KEY or /exchange/NAME/KEY." + NAME_RULE,
}
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
#: With "encoding": "base64" the body is base64 (RFC 4648, padded).
BASE64_BODY = {
    "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
    "then": {"properties": {"body": {"pattern": BASE64}}},
}
_B = "[A-Za-z0-9+/]"
#: A hash qmq.auth.passwords.parse_hash reads: costs in its bounds, a salt of
#: at least 8 bytes and a key of at least 16, in base64.
SCRYPT_HASH = (
    "^\\$scrypt\\$ln=(?:0?[1-9]|1[0-9]|20),r=(?:0?[1-9]|[12][0-9]|3[0-2]),p=(?:0?[1-9]|1[0-6])"
    f"\\$(?:(?:{_B}{{4}}){{3,}}(?:{_B}{{2}}==|{_B}{{3}}=)?|{_B}{{11}}=)"
    f"\\$(?:(?:{_B}{{4}}){{6,}}(?:{_B}{{2}}==|{_B}{{3}}=)?|{_B}{{20}}(?:{_B}{{2}}==|{_B}{{3}}=))$"
)
#: A permission's pattern: a regular expression ({user} stands for the user's name).
PATTERN = {"type": "string", "format": "regex", "default": ""}
#: A receipt handle, TOKEN.TAG (qmq.web.api.frontend.parse_handle).
HANDLE = {"type": "string", "maxLength": 128, "pattern": "^.+\\.[0-9]{1,18}$",
          "description": "A receipt handle from a receive (TOKEN.TAG)."}
#: A topic poll's cursor, FOLLOWER.SEQ.
POLL_CURSOR = {"type": "string", "pattern": "^.+\\.[0-9]{1,19}$"}
#: A scan's cursor (qmq.core.vhost.make_cursor).
SCAN_CURSOR = {"type": "string", "pattern": "^i[0-9a-f]{1,16}$"}


USER = {**_path_param("user", "The user's name (1 to 128 characters, no control character).", "alice"),
        "schema": {**NAME, "maxLength": 128}}
ADMIN_ONLY = "For the users named in http_api.admins (anyone when authentication is off)."
RUNTIME_CHANGE = (
    "The change applies at once to new logins, to the next request over HTTP (cached logins are dropped) and "
    "to the next destination an open STOMP, WebSocket or SockJS session of the user names. "
    "It is kept in memory only: a restart goes back to the configuration file."
)


def _query(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _paging(s: ApiSettings) -> list[dict]:
    return [
        _query("limit", {"type": "integer", "minimum": 1, "maximum": s.max_list},
               "Most items in the answer (at most http_api.max_list)."),
        _query("offset", {"type": "integer", "minimum": 0, "maximum": 1 << 62}, "Items to skip (next_offset of the previous page)."),
    ]


def _op(summary: str, responses: dict, *errors: int, params: list | None = None, body: dict | None = None,
        description: str = "", tag: str = "") -> dict:
    # Any request may be malformed, sent with another method, too large or too
    # slow, to a name that is not the broker's or from a foreign page
    # (qmq.web.guard); with authentication on, any but the documents may be
    # refused.
    codes = {400, 403, 405, 408, 413, 421, *errors}
    if tag != "meta":
        codes |= {401, 429}
    codes = sorted(codes)
    op: dict[str, Any] = {"summary": summary, "responses": {**responses, **_errors(*codes)}}
    op["operationId"] = summary.lower().replace(" ", "_").replace(",", "").replace("'", "")
    if description:
        op["description"] = description
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = body
    if tag:
        op["tags"] = [tag]
    return op


def _ok(schema: dict, description: str = "OK", status: int = 200, avro: bool = False, headers: dict | None = None) -> dict:
    content = _json(schema)
    if avro:
        content.update(AVRO_MEDIA)
    r: dict[str, Any] = {"description": description, "content": content}
    if headers:
        r["headers"] = headers
    return {str(status): r}


HEALTH = {
    "type": "object", "required": ["status", "checks"],
    "properties": {
        "status": {"enum": ["ok", "failing"]},
        "checks": {"type": "object", "required": ["listeners", "store", "alarms"], "properties": {
            "listeners": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
            "store": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
            "alarms": {"type": "object", "required": ["ok", "alarms"], "properties": {
                "ok": {"type": "boolean"},
                "alarms": {"type": "array", "items": {"enum": ["memory", "disk", "store"]}}}},
        }},
    },
}

LIVE = {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}

LISTENER = {
    "type": "object", "required": ["protocol", "spec", "port", "listening"],
    "properties": {"protocol": {"type": "string"}, "spec": {"type": "string"},
                   "port": {"type": ["integer", "null"]}, "listening": {"type": "boolean"}},
}

HEALTH_CHECK = {
    "type": "object", "required": ["check", "ok"],
    "properties": {
        "check": {"enum": ["listeners", "store", "alarms", "port-listener"]},
        "ok": {"type": "boolean"},
        "port": {"type": "integer"},
        "listeners": {"type": "array", "items": LISTENER},
        "failure": {"type": ["string", "null"]},
        "alarms": {"type": "array", "items": {
            "type": "object", "required": ["name", "detail", "persistent_only"],
            "properties": {"name": {"enum": ["memory", "disk", "store"]}, "detail": {"type": "string"},
                           "persistent_only": {"type": "boolean"}}}},
        "disk": {"type": "object", "properties": {
            "free_bytes": {"type": "integer"}, "limit_bytes": {"type": "integer"}}},
    },
}

MONITORS = ("For the users named in http_api.admins or http_api.monitors (anyone when authentication "
            "is off); they need no permission in any virtual host.")

def _publish_body(named: bool) -> dict:
    """The body of a publish: messages that name their destination
    (C{named}: POST .../messages) or not (the path names it)."""
    one, batch = ("PublishToDestination", "PublishToDestinationBatch") if named else ("PublishMessage", "PublishBatch")
    return {
        "required": True,
        "description": "One message, or a batch {\"messages\": [...]}; in Avro one PublishMessage datum, or an "
        "object container file of them.",
        "content": {
            "application/json": {"schema": {"oneOf": [_ref(one), _ref(batch)]}},
            "avro/binary": {"schema": {"type": "string", "contentMediaType": "avro/binary"}},
        },
    }

PUBLISH_DESCRIPTION = (
    "Publishes in order. The answer (201) comes once every message is as durable as a STOMP RECEIPT "
    "promises: for persistent messages routed to durable queues with the commit log and fsync = \"always\", "
    "after they are synced to disk; 'stored' counts the messages whose store write the answer waited for. "
    "Every destination is checked before any message is published; a queue that refuses a message "
    "(reject-publish, 429) stops the batch there and the problem says how many were published."
)


def _publish_op(summary: str, params: list, named: bool = False) -> dict:
    return _op(
        summary, _ok(_ref("Published"), "Published", 201), 400, 404, 408, 409, 413, 415, 429, 503,
        params=params, body=_publish_body(named), description=PUBLISH_DESCRIPTION, tag="messages",
    )


def _handles_body(s: ApiSettings, extra: dict) -> dict:
    body = {"required": True, "content": _json({
        "type": "object",
        "required": ["handles"],
        "additionalProperties": False,
        "properties": {"handles": {"type": "array", "minItems": 1, "maxItems": s.max_batch, "items": HANDLE},
                       **extra},
    })}
    return body


def _schemas(s: ApiSettings) -> dict:
    headers = {
        "type": "object",
        "description": "Application headers: strings, numbers, booleans, null, or bytes as {\"base64\": TEXT}.",
        "propertyNames": {"minLength": 1, "maxLength": 255, "pattern": NAME["pattern"]},
        "additionalProperties": {
            "oneOf": [
                {"type": ["string"], "maxLength": MAX_HEADER_TEXT, "pattern": VALUE_PATTERN},
                {"type": ["number", "boolean", "null"]},
                {"type": "object", "required": ["base64"], "additionalProperties": False,
                 "properties": {"base64": {"type": "string", "pattern": BASE64}}},
            ]
        },
    }
    properties = {
        "type": "object",
        "description": "The message's properties that are set.",
        "additionalProperties": False,
        "properties": {name: {"type": "string", "maxLength": MAX_HEADER_TEXT, "pattern": VALUE_PATTERN}
                       for name in PROPERTY_NAMES},
    }
    message = {
        "body": {"type": "string", "description": "The payload: UTF-8 text, or base64 (see encoding)."},
        "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
        "headers": headers,
        "properties": properties,
        "routing_key": {**KEY, "description": "For the exchange endpoint."},
        "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY, "default": 0},
        "ttl": {"type": "integer", "minimum": 0, "maximum": MAX_SPAN_MS,
                "description": "Milliseconds from the publish until it expires."},
        "delay": {"type": "integer", "minimum": 0, "maximum": MAX_SPAN_MS,
                  "description": "Milliseconds from the publish before its first delivery (the "
                  "broker keeps it, on disk when persistent, meanwhile)."},
        "persistent": {"type": "boolean", "default": False},
        "expires": {"type": "number", "minimum": 0, "maximum": MAX_EPOCH_MS / 1000,
                    "description": "When it expires, seconds since the epoch (with ttl, the earlier)."},
        "deliver_at": {"type": "number", "minimum": 0, "maximum": MAX_EPOCH_MS / 1000,
                       "description": "Not delivered before this time, seconds since the epoch (with "
                       "delay, the later)."},
        "ack_timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_ACK_TIMEOUT,
                        "description": "Seconds a receiver may hold it unacknowledged before it is "
                        "delivered again."},
    }
    return {
        "Problem": {
            "type": "object",
            "description": "An RFC 9457 problem document.",
            "required": ["type", "title", "status", "detail", "code"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "code": {"type": "string", "description": "A short stable name of the error."},
                "published": {"type": "integer"},
                "ids": {"type": "array", "items": {"type": ["string", "null"]}},
            },
        },
        "PublishMessage": {
            "type": "object",
            "description": "A message to publish where the path names the destination.",
            "required": ["body"],
            "additionalProperties": False,
            "properties": message,
            **BASE64_BODY,
        },
        "PublishToDestination": {
            "type": "object",
            "description": "A message to publish that names its destination (POST .../messages).",
            "required": ["body", "destination"],
            "additionalProperties": False,
            "properties": {**message, "destination": DESTINATION},
            **BASE64_BODY,
        },
        "PublishBatch": {
            "type": "object",
            "required": ["messages"],
            "additionalProperties": False,
            "properties": {"messages": {"type": "array", "minItems": 1, "maxItems": s.max_batch,
                                        "items": _ref("PublishMessage")}},
        },
        "PublishToDestinationBatch": {
            "type": "object",
            "required": ["messages"],
            "additionalProperties": False,
            "properties": {"messages": {"type": "array", "minItems": 1, "maxItems": s.max_batch,
                                        "items": _ref("PublishToDestination")}},
        },
        "Published": {
            "type": "object",
            "required": ["published", "ids", "stored"],
            "properties": {
                "published": {"type": "integer"},
                "ids": {"type": "array", "items": {"type": "string"},
                        "description": "The messages' ids (NODE.NUMBER, as a Delivery's id) in order."},
                "stored": {"type": "integer", "description": "Messages whose store write the answer waited for."},
            },
        },
        "Delivery": {
            "type": "object",
            "required": ["id", "number", "destination", "exchange", "routing_key", "headers", "properties", "body",
                         "encoding", "timestamp", "redelivered", "delivery_count", "priority", "persistent", "expires"],
            "properties": {
                "handle": {"type": "string", "description": "Receipt handle (received messages)."},
                "seq": {"type": "integer", "description": "Position in a topic follower's stream (topic polls)."},
                "id": {"type": "string", "description": "The message's id, NODE.NUMBER: it never names "
                       "another message, on any node, before or after a restart (a message given back "
                       "after a restart keeps it)."},
                "number": {"type": "integer", "description": "The message's number on its node: increases "
                           "in publish order; range scans go by it."},
                "destination": {"type": "string"},
                "exchange": {"type": "string"},
                "routing_key": {"type": "string"},
                "headers": headers,
                "properties": properties,
                "body": {"type": "string"},
                "encoding": {"enum": ["utf-8", "base64"]},
                "timestamp": {"type": "number", "description": "Seconds since the epoch."},
                "redelivered": {"type": "boolean"},
                "delivery_count": {"type": "integer"},
                "priority": {"type": "integer"},
                "persistent": {"type": "boolean"},
                "expires": {"type": ["number", "null"]},
            },
        },
        "Received": {
            "type": "object",
            "required": ["messages", "visibility"],
            "properties": {"messages": {"type": "array", "items": _ref("Delivery")}, "visibility": {"type": "number"}},
        },
        "Polled": {
            "type": "object",
            "required": ["messages", "cursor", "dropped"],
            "properties": {
                "messages": {"type": "array", "items": _ref("Delivery")},
                "cursor": {"type": "string"},
                "dropped": {"type": "integer", "description": "Messages dropped since the last poll (backlog full)."},
            },
        },
        "Scanned": {
            "type": "object",
            "required": ["messages", "next_cursor"],
            "properties": {
                "messages": {"type": "array", "items": _ref("Delivery")},
                "next_cursor": {"type": ["string", "null"], "description": "null once the range is done."},
            },
        },
        "Settled": {
            "type": "object",
            "required": ["settled", "unknown"],
            "properties": {"settled": {"type": "integer"}, "unknown": {"type": "array", "items": {"type": "string"}}},
        },
        "VHost": {
            "type": "object",
            "required": ["name", "queues", "exchanges"],
            "properties": {"name": {"type": "string"}, "queues": {"type": "integer"}, "exchanges": {"type": "integer"}},
        },
        "Queue": {
            "type": "object",
            "required": ["name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "messages",
                         "messages_ready", "messages_unacknowledged", "ready_bytes", "consumers", "dropped",
                         "message_stats"],
            "properties": {
                "name": {"type": "string"}, "vhost": {"type": "string"}, "durable": {"type": "boolean"},
                "auto_delete": {"type": "boolean"}, "exclusive": {"type": "boolean"}, "arguments": {"type": "object"},
                "messages": {"type": "integer"}, "messages_ready": {"type": "integer"},
                "messages_unacknowledged": {"type": "integer"}, "ready_bytes": {"type": "integer"},
                "consumers": {"type": "integer"}, "dropped": {"type": "integer"},
                "home": {"type": "string", "description": "In a mesh (and with workers) only: the node the "
                         "queue lives on; its counts are the home's, asked by the node that answers."},
                "message_stats": {
                    "type": "object",
                    "description": "Messages routed to the queue (publish) and handed out by it over every "
                    "protocol (deliver) since it was made, and their rates: messages a second since the previous "
                    "reading at least a second before (0 at the first reading).",
                    "required": ["publish", "deliver", "publish_rate", "deliver_rate"],
                    "properties": {"publish": {"type": "integer"}, "deliver": {"type": "integer"},
                                   "publish_rate": {"type": "number"}, "deliver_rate": {"type": "number"}},
                },
            },
        },
        "QueueDeclaration": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "durable": {"type": "boolean", "default": True},
                "auto_delete": {"type": "boolean", "default": False},
                "arguments": {"type": "object", "description": ", ".join(QUEUE_ARGUMENTS)
                              + " (as in STOMP and the configuration)."},
            },
        },
        "Exchange": {
            "type": "object",
            "required": ["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments", "bindings"],
            "properties": {
                "name": {"type": "string"}, "vhost": {"type": "string"},
                "type": {"enum": ["direct", "fanout", "topic", "headers"]},
                "durable": {"type": "boolean"}, "auto_delete": {"type": "boolean"},
                "internal": {"type": "boolean"}, "arguments": {"type": "object"}, "bindings": {"type": "integer"},
            },
        },
        "ExchangeDeclaration": {
            "type": "object",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": {"enum": ["direct", "fanout", "topic", "headers"]},
                "durable": {"type": "boolean", "default": True},
                "auto_delete": {"type": "boolean", "default": False},
                "internal": {"type": "boolean", "default": False,
                             "description": "Clients may not publish to it (403); bindings from other exchanges "
                             "route into it."},
                "arguments": EXCHANGE_ARGUMENTS,
            },
        },
        "Binding": {
            "type": "object",
            "required": ["queue", "exchange", "routing_key", "arguments"],
            "properties": {"queue": {"type": "string"}, "exchange": {"type": "string"},
                           "routing_key": {"type": "string"}, "arguments": {"type": "object"},
                           "home": {"type": "string", "description": "In a mesh only: the queue's node, "
                                    "which holds the binding."}},
        },
        "BindingDeclaration": {
            "type": "object",
            "required": ["queue", "exchange"],
            "additionalProperties": False,
            "properties": {"queue": {"type": "string"}, "exchange": {"type": "string"},
                           "routing_key": {"type": "string", "default": ""},
                           "arguments": {"type": "object", "description": "A headers exchange's binding "
                                         "arguments (x-match all or any, and the headers to match)."}},
        },
        "Connection": {
            "type": "object",
            "required": ["id", "protocol", "peer", "user"],
            "properties": {"id": {"type": "string", "description": "In a mesh (and with workers): ID@NODE."},
                           "protocol": {"type": "string"}, "peer": {"type": "string"},
                           "user": {"type": "string"},
                           "node": {"type": "string", "description": "In a mesh only: the node (worker) the "
                                    "connection is on."}},
        },
        "Link": {
            "type": "object",
            "description": "A link to another node of the mesh, with its counters.",
            "required": ["node", "direction", "address", "state", "messages_out", "bytes_out",
                         "messages_in", "bytes_in", "dropped", "refused", "buffered_bytes", "peer_interest"],
            "properties": {
                "node": {"type": "string"}, "direction": {"type": "string", "enum": ["in", "out"]},
                "address": {"type": "string"}, "state": {"type": "string"},
                "up_seconds": {"type": ["number", "null"]}, "rtt_ms": {"type": ["number", "null"]},
                "messages_out": {"type": "integer"}, "bytes_out": {"type": "integer"},
                "messages_in": {"type": "integer"}, "bytes_in": {"type": "integer"},
                "dropped": {"type": "integer"}, "refused": {"type": "integer"},
                "buffered_bytes": {"type": "integer"},
                "peer_interest": {"type": "array", "items": {"type": "string"}},
                "unconfirmed": {"type": "integer", "description": "Publishes forwarded to queues homed on "
                                "the peer, waiting for its confirm."},
                "peer_consumers": {"type": "integer", "description": "The peer's consumers of queues homed "
                                   "on this node."},
            },
        },
        "User": {
            "type": "object",
            "description": "A user of the broker. Its password hash is never shown.",
            "required": ["name", "password", "certificate_names", "source", "admin"],
            "properties": {
                "name": {"type": "string"},
                "password": {"type": "boolean", "description": "Whether it may log in with a password."},
                "certificate_names": {"type": "array", "items": {"type": "string"}},
                "source": {"enum": ["config", "runtime"], "description": "config: from the configuration file; "
                           "runtime: made through this API (gone after a restart)."},
                "admin": {"type": "boolean", "description": "Whether it is named in http_api.admins."},
            },
        },
        "UserDeclaration": {
            "type": "object",
            "additionalProperties": False,
            "description": "At least one of password, password_hash, certificate_names (not both password and "
            "password_hash).",
            "anyOf": [{"required": ["password"]}, {"required": ["password_hash"]},
                      {"required": ["certificate_names"], "properties": {"certificate_names": {"minItems": 1}}}],
            "not": {"required": ["password", "password_hash"]},
            "properties": {
                "password": {"type": "string", "minLength": 1, "description": "Hashed by the broker (scrypt)."},
                "password_hash": {"type": "string", "pattern": SCRYPT_HASH,
                                  "description": "A hash printed by qmq-passwd."},
                "certificate_names": {"type": "array", "items": {"type": "string", "minLength": 1}},
            },
        },
        "Permission": {
            "type": "object",
            "required": ["vhost", "user", "configure", "write", "read"],
            "properties": {"vhost": {"type": "string"}, "user": {"type": "string"},
                           "configure": {"type": "string"}, "write": {"type": "string"},
                           "read": {"type": "string"}},
        },
        "PermissionDeclaration": {
            "type": "object",
            "additionalProperties": False,
            "description": "Regular expressions searched for in resource names; empty (the default) allows "
            "nothing; {user} stands for the user's name.",
            "properties": {"configure": PATTERN, "write": PATTERN, "read": PATTERN},
        },
        "Page": {
            "type": "object",
            "required": ["total", "offset", "next_offset"],
            "properties": {"total": {"type": "integer"}, "offset": {"type": "integer"},
                           "next_offset": {"type": ["integer", "null"]}},
        },
    }


#: The fields of a whole-broker listing in a mesh (qmq.cluster.manage).
_WHOLE = {
    "missing": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "In a mesh (and with workers) only: the nodes that did not answer in time, each "
                "with why; the list lacks their items (empty when every node answered)."},
    "truncated": {"type": "array", "items": {"type": "string"},
                  "description": "Nodes whose answer was cut at 10,000 items."},
}


def _list(key: str, item: str, total: bool = True, whole: bool = False) -> dict:
    schema: dict[str, Any] = {
        "type": "object",
        "required": [key, "offset", "next_offset"] + (["total"] if total else []),
        "properties": {key: {"type": "array", "items": _ref(item)}, "offset": {"type": "integer"},
                       "next_offset": {"type": ["integer", "null"]}, "total": {"type": "integer"},
                       **(_WHOLE if whole else {})},
    }
    return schema


_Q = "/api/v1/vhosts/{vhost}/queues/{queue}"
_X = "/api/v1/vhosts/{vhost}/exchanges/{exchange}"
_IN_QUEUE = {"path.vhost": "$request.path.vhost", "path.queue": "$request.path.queue"}
_IN_EXCHANGE = {"path.vhost": "$request.path.vhost", "path.exchange": "$request.path.exchange"}
_HANDLE = {"handles": ["$response.body#/messages/0/handle"]}
_PERMISSION = {"path.vhost": "$request.path.vhost", "path.user": "$request.path.user"}

#: OpenAPI links: (source path, method, statuses, link name, target path,
#: method, parameters, request body). What one operation makes (a queue, a
#: message's receipt handle, a cursor, a binding, a user) feeds the
#: operations that use it, for clients and for schemathesis' stateful runs.
LINKS: tuple[tuple[str, str, tuple[str, ...], str, str, str, dict, Any], ...] = (
    *((_Q, "put", ("200", "201"), name, path, method, _IN_QUEUE, None) for name, path, method in (
        ("GetQueue", _Q, "get"), ("DeleteQueue", _Q, "delete"), ("PublishToQueue", _Q + "/messages", "post"),
        ("PurgeQueue", _Q + "/messages", "delete"), ("ReceiveFromQueue", _Q + "/receive", "post"),
        ("ScanQueue", _Q + "/scan", "get"))),
    (_Q, "put", ("200", "201"), "BindQueue", "/api/v1/vhosts/{vhost}/bindings", "post",
     {"path.vhost": "$request.path.vhost"},
     {"queue": "$request.path.queue", "exchange": "amq.topic", "routing_key": "#"}),
    (_Q + "/messages", "post", ("201",), "ReceiveFromQueue", _Q + "/receive", "post", _IN_QUEUE, None),
    *((_Q + "/receive", "post", ("200",), name, _Q + "/" + action, "post", _IN_QUEUE, _HANDLE)
      for name, action in (("Ack", "ack"), ("Nack", "nack"), ("Extend", "extend"))),
    ("/api/v1/vhosts/{vhost}/topics/{topic}/poll", "get", ("200",), "PollAgain",
     "/api/v1/vhosts/{vhost}/topics/{topic}/poll", "get",
     {"path.vhost": "$request.path.vhost", "path.topic": "$request.path.topic",
      "query.cursor": "$response.body#/cursor"}, None),
    *((_X, "put", ("200", "201"), name, path, method, _IN_EXCHANGE, None) for name, path, method in (
        ("GetExchange", _X, "get"), ("DeleteExchange", _X, "delete"),
        ("PublishToExchange", _X + "/messages", "post"))),
    ("/api/v1/vhosts/{vhost}/bindings", "post", ("201",), "Unbind", "/api/v1/vhosts/{vhost}/bindings", "delete",
     {"path.vhost": "$request.path.vhost", "query.queue": "$response.body#/queue",
      "query.exchange": "$response.body#/exchange", "query.routing_key": "$response.body#/routing_key"}, None),
    ("/api/v1/connections", "get", ("200",), "CloseConnection", "/api/v1/connections/{connection}", "delete",
     {"path.connection": "$response.body#/connections/0/id"}, None),
    *(("/api/v1/users/{user}", "put", ("200", "201"), name, "/api/v1/users/{user}", method,
       {"path.user": "$request.path.user"}, None) for name, method in (("GetUser", "get"), ("DeleteUser", "delete"))),
    *(("/api/v1/permissions/{vhost}/{user}", "put", ("200", "201"), name, "/api/v1/permissions/{vhost}/{user}",
       method, _PERMISSION, None) for name, method in (("GetPermission", "get"), ("DeletePermission", "delete"))),
)


def _link(paths: dict) -> None:
    """Add L{LINKS} to the responses of C{paths}."""
    for source, method, statuses, name, target, target_method, parameters, body in LINKS:
        link: dict[str, Any] = {"operationId": paths[target][target_method]["operationId"], "parameters": parameters}
        if body is not None:
            link["requestBody"] = body
        for status in statuses:
            paths[source][method]["responses"][status].setdefault("links", {})[name] = link


def document(s: ApiSettings | None = None) -> dict:
    """The OpenAPI 3.1 document (a JSON object)."""
    s = s or ApiSettings()
    receive_params = [
        VHOST, QUEUE,
        _query("max", {"type": "integer", "minimum": 1, "maximum": s.max_batch, "default": 1}, "Most messages."),
        _query("wait", {"type": "number", "minimum": 0, "maximum": s.max_wait, "default": 0},
               "Seconds to wait for a message when none is ready (long poll)."),
        _query("visibility", {"type": "number", "minimum": 0.001, "maximum": s.max_visibility,
                              "default": s.default_visibility},
               "Seconds the messages stay invisible; unsettled by then they go back to the queue."),
        _query("encoding", {"enum": ["auto", "base64"], "default": "auto"},
               "auto: bodies that are UTF-8 come as text, others as base64; base64: always base64."),
    ]
    poll_params = [
        VHOST, TOPIC,
        _query("cursor", POLL_CURSOR, "The cursor of the previous answer; without it a new follower starts."),
        _query("max", {"type": "integer", "minimum": 1, "maximum": s.max_batch, "default": 100}, "Most messages."),
        _query("wait", {"type": "number", "minimum": 0, "maximum": s.max_wait, "default": 0}, "Seconds to wait."),
        _query("encoding", {"enum": ["auto", "base64"], "default": "auto"}, "Body encoding (see receive)."),
    ]
    paths: dict[str, dict] = {
        "/api/v1": {"get": _op("API index", _ok({"type": "object"}), tag="meta")},
        "/api/v1/openapi.json": {"get": _op("This document", _ok({"type": "object"}), tag="meta")},
        "/api/v1/health": {"get": _op(
            "Readiness", {**_ok(HEALTH, "Every check passes"),
                          "503": {"description": "A check fails", "content": _json(HEALTH)}},
            description="Readiness, open to anyone: every configured listener bound, the store "
                        "healthy, no alarm. Names each check and whether it passes, and the alarms "
                        "that hold; the details are in /api/v1/health/checks/NAME.",
            tag="meta")},
        "/api/v1/health/ready": {"get": _op(
            "Readiness check", {**_ok(HEALTH, "Every check passes"),
                          "503": {"description": "A check fails", "content": _json(HEALTH)}},
            description="Readiness, open to anyone: every configured listener bound, the store "
                        "healthy, no alarm. Names each check and whether it passes, and the alarms "
                        "that hold; the details are in /api/v1/health/checks/NAME.",
            tag="meta")},
        "/api/v1/health/live": {"get": _op(
            "Liveness", _ok(LIVE, "The process answers"),
            description="Open to anyone: 200 whenever the broker answers.", tag="meta")},
        "/api/v1/health/checks/{check}": {"get": _op(
            "Run a health check", {**_ok(HEALTH_CHECK, "The check passes"),
                                   "503": {"description": "The check fails", "content": _json(HEALTH_CHECK)}},
            401, 404, params=[{**_path_param("check", "listeners, store or alarms"),
                              "schema": {"enum": ["listeners", "store", "alarms"]}}],
            description="One readiness check with its details. " + MONITORS, tag="meta")},
        "/api/v1/health/checks/port-listener/{port}": {"get": _op(
            "Check a port listener", {**_ok(HEALTH_CHECK, "A configured listener is bound to the port"),
                                      "503": {"description": "None is", "content": _json(HEALTH_CHECK)}},
            401, params=[{**_path_param("port", "A TCP port, 1 to 65535"),
                          "schema": {"type": "integer", "minimum": 1, "maximum": 65535}}],
            description="Whether a configured listener is bound to PORT. " + MONITORS, tag="meta")},
        "/api/v1/schemas": {"get": _op("List the Avro schemas", _ok({
            "type": "object", "required": ["schemas"],
            "properties": {"schemas": {"type": "array", "items": {"type": "string"}}}}), tag="meta")},
        "/api/v1/schemas/{schema}": {"get": _op(
            "Get an Avro schema", _ok({"type": "object"}, "The .avsc document"), 404,
            params=[_path_param("schema", "PublishMessage or Delivery, with or without .avsc")], tag="meta")},
        "/api/v1/vhosts": {"get": _op("List virtual hosts", _ok({
            "type": "object", "required": ["vhosts"],
            "properties": {"vhosts": {"type": "array", "items": _ref("VHost")}}}), tag="management")},
        "/api/v1/vhosts/{vhost}": {"get": _op("Get a virtual host", _ok(_ref("VHost")), 404, params=[VHOST],
                                              tag="management")},
        "/api/v1/vhosts/{vhost}/messages": {"post": _publish_op("Publish to named destinations", [VHOST], named=True)},
        "/api/v1/vhosts/{vhost}/queues": {"get": _op(
            "List queues", _ok(_list("queues", "Queue", whole=True)), 400, 404,
            params=[VHOST, *_paging(s), _query("prefix", {"type": "string"}, "Only queues whose name starts so.")],
            tag="management")},
        "/api/v1/vhosts/{vhost}/queues/{queue}": {
            "get": _op("Get a queue", _ok(_ref("Queue")), 404, 503, params=[VHOST, QUEUE], tag="management"),
            "put": _op("Declare a queue", {**_ok(_ref("Queue"), "It existed"), **_ok(_ref("Queue"), "Created", 201)},
                       400, 403, 404, 408, 409, 413, 415, params=[VHOST, QUEUE],
                       body={"required": False, "content": _json(_ref("QueueDeclaration"))}, tag="management"),
            "delete": _op("Delete a queue", _ok({"type": "object", "required": ["deleted", "messages"], "properties": {
                "deleted": {"type": "string"}, "messages": {"type": "integer"}}}), 403, 404, 503,
                params=[VHOST, QUEUE], tag="management"),
        },
        "/api/v1/vhosts/{vhost}/queues/{queue}/messages": {
            "post": _publish_op("Publish to a queue", [VHOST, QUEUE]),
            "delete": _op("Purge a queue", _ok({"type": "object", "required": ["purged"],
                                                "properties": {"purged": {"type": "integer"}}}), 404, 503,
                          params=[VHOST, QUEUE], tag="management"),
        },
        "/api/v1/vhosts/{vhost}/queues/{queue}/receive": {"post": _op(
            "Receive from a queue", _ok(_ref("Received"), "Messages (maybe none); in Avro an object container "
                                        "file of Delivery records", avro=True), 400, 403, 404,
            params=receive_params, tag="messages",
            description="Takes up to max messages, waiting up to wait seconds for the first. Each comes with a "
            "receipt handle; ack, nack or extend it before its visibility runs out, or it goes back to the queue "
            "(redelivered). Send Accept: avro/binary for Avro.")},
        "/api/v1/vhosts/{vhost}/queues/{queue}/ack": {"post": _op(
            "Acknowledge received messages", _ok(_ref("Settled")), 400, 404, 408, 413, 415,
            params=[VHOST, QUEUE], body=_handles_body(s, {}), tag="messages")},
        "/api/v1/vhosts/{vhost}/queues/{queue}/nack": {"post": _op(
            "Give back received messages", _ok(_ref("Settled")), 400, 404, 408, 413, 415,
            params=[VHOST, QUEUE], tag="messages",
            body=_handles_body(s, {"requeue": {"type": "boolean", "default": True, "description":
                                "true: back to the queue; false: they leave it (dead-lettered where configured)."}}))},
        "/api/v1/vhosts/{vhost}/queues/{queue}/extend": {"post": _op(
            "Extend the visibility of received messages", _ok(_ref("Settled")), 400, 404, 408, 413, 415,
            params=[VHOST, QUEUE], tag="messages",
            body=_handles_body(s, {"visibility": {"type": "number", "minimum": 0.001,
                                               "maximum": s.max_visibility}}))},
        "/api/v1/vhosts/{vhost}/queues/{queue}/scan": {"get": _op(
            "Scan a queue by time",
            _ok(_ref("Scanned"), "A page of kept messages, not consumed (in Avro: an object container file; the "
                "next cursor in the QMQ-Next-Cursor header)", avro=True,
                headers={"QMQ-Next-Cursor": {"schema": {"type": "string"}, "description": "Avro answers only."}}),
            404, params=[
                VHOST, QUEUE,
                _query("start", {"type": "number", "minimum": 0, "maximum": 1e11, "default": 0}, "From (seconds since the epoch)."),
                _query("end", {"type": "number", "minimum": 0, "maximum": 1e11}, "Until, excluded (seconds since the epoch)."),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "Most messages."),
                _query("cursor", SCAN_CURSOR, "next_cursor of the previous page."),
                _query("encoding", {"enum": ["auto", "base64"], "default": "auto"}, "Body encoding (see receive)."),
            ], tag="messages",
            description="Reads a durable queue's persistent messages published in [start, end) from the commit log "
            "(store = \"log\"), by id, without consuming them: those it holds and those acked less than its "
            "x-retention ago. A queue with no log to read is a 400 (cannot-scan).")},
        "/api/v1/vhosts/{vhost}/topics/{topic}/messages": {"post": _publish_op("Publish to a topic", [VHOST, TOPIC])},
        "/api/v1/vhosts/{vhost}/topics/{topic}/events": {"get": _op(
            "Follow a topic as Server-Sent Events",
            {"200": {"description": "An endless text/event-stream; each event is a Delivery as JSON.",
                     "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            400, 404, 429, params=[VHOST, TOPIC], tag="topics")},
        "/api/v1/vhosts/{vhost}/topics/{topic}/poll": {"get": _op(
            "Follow a topic by polling with a cursor",
            _ok(_ref("Polled"), "Messages after the cursor, and the next cursor (in Avro: an object container file; "
                "the cursor in the QMQ-Cursor header)", avro=True,
                headers={"QMQ-Cursor": {"schema": {"type": "string"}, "description": "Avro answers only."},
                         "QMQ-Dropped": {"schema": {"type": "string"}, "description": "Avro answers only."}}),
            400, 404, 410, 429, params=poll_params, tag="topics")},
        "/api/v1/vhosts/{vhost}/exchanges": {"get": _op(
            "List exchanges", _ok(_list("exchanges", "Exchange")), 400, 404, params=[VHOST, *_paging(s)],
            tag="management")},
        "/api/v1/vhosts/{vhost}/exchanges/{exchange}": {
            "get": _op("Get an exchange", _ok(_ref("Exchange")), 404, params=[VHOST, EXCHANGE], tag="management"),
            "put": _op("Declare an exchange", {**_ok(_ref("Exchange"), "It existed"),
                                               **_ok(_ref("Exchange"), "Created", 201)},
                       400, 403, 404, 408, 409, 413, 415, params=[VHOST, EXCHANGE],
                       body={"required": True, "content": _json(_ref("ExchangeDeclaration"))}, tag="management"),
            "delete": _op("Delete an exchange", _ok({"type": "object", "required": ["deleted"],
                                                     "properties": {"deleted": {"type": "string"}}}), 403, 404,
                          params=[VHOST, EXCHANGE], tag="management"),
        },
        "/api/v1/vhosts/{vhost}/exchanges/{exchange}/messages": {
            "post": _publish_op("Publish to an exchange", [VHOST, EXCHANGE])},
        "/api/v1/vhosts/{vhost}/bindings": {
            "get": _op("List bindings", _ok(_list("bindings", "Binding", total=False, whole=True)), 400, 404,
                       params=[VHOST, *_paging(s)], tag="management"),
            "post": _op("Bind a queue", _ok(_ref("Binding"), "Bound", 201), 400, 403, 404, 408, 409, 413, 415, 503,
                        params=[VHOST], body={"required": True, "content": _json(_ref("BindingDeclaration"))},
                        tag="management"),
            "delete": _op("Unbind a queue", _ok({"type": "object", "required": ["deleted"], "properties": {
                "deleted": {"type": "object"}}}), 400, 403, 404, 409, 503, params=[
                VHOST, {**_query("queue", NAME, "The queue."), "required": True},
                {**_query("exchange", EXCHANGE_NAME, "The exchange."), "required": True},
                _query("routing_key", KEY, "The routing key (empty if not given)."),
                {"name": "arguments", "in": "query", "required": False,
                 "description": "The binding's arguments as a JSON object (a headers exchange's), as it was "
                 "made with them.", "content": {"application/json": {"schema": {"type": "object"}}}}],
                tag="management"),
        },
        "/api/v1/connections": {"get": _op("List connections", _ok(_list("connections", "Connection", whole=True)), 400, 404,
                                           params=_paging(s), tag="management")},
        "/api/v1/connections/{connection}": {"delete": _op(
            "Close a connection", _ok({"type": "object", "required": ["closed"],
                                       "properties": {"closed": {"type": "string"}}}), 404, 503,
            params=[_path_param("connection", "The id from the listing.")], tag="management")},
        "/api/v1/links": {"get": _op(
            "List the mesh's links", _ok({"type": "object", "required": ["node", "links"], "properties": {
                "node": {"type": "string"}, "links": {"type": "array", "items": _ref("Link")}}}),
            tag="management", description="This node's links to the other nodes of its mesh "
            "(docs/cluster.rst); an empty list without one. " + ADMIN_ONLY)},
        "/api/v1/users": {"get": _op("List users", _ok(_list("users", "User")), 400, params=_paging(s),
                                     tag="users", description=ADMIN_ONLY)},
        "/api/v1/users/{user}": {
            "get": _op("Get a user", _ok(_ref("User")), 404, params=[USER], tag="users", description=ADMIN_ONLY),
            "put": _op("Create or change a user", {**_ok(_ref("User"), "Changed"), **_ok(_ref("User"), "Created", 201)},
                       400, 409, 415, params=[USER], body={"required": True, "content": _json(_ref("UserDeclaration"))},
                       tag="users", description=ADMIN_ONLY + " " + RUNTIME_CHANGE + " 409: authentication is off, "
                       "or a certificate name is another user's."),
            "delete": _op("Delete a user", _ok({"type": "object", "required": ["deleted", "connections_closed"],
                                                "properties": {"deleted": {"type": "string"},
                                                               "connections_closed": {"type": "integer"}}}),
                          404, 409, params=[USER], tag="users",
                          description=ADMIN_ONLY + " " + RUNTIME_CHANGE + " Its permissions go with it and its "
                          "connections (STOMP, WebSocket, SockJS) are closed."),
        },
        "/api/v1/permissions": {"get": _op(
            "List permissions", _ok(_list("permissions", "Permission")), 400, tag="users", description=ADMIN_ONLY,
            params=[*_paging(s), _query("user", {"type": "string"}, "Only this user's."),
                    _query("vhost", {"type": "string"}, "Only this virtual host's.")])},
        "/api/v1/permissions/{vhost}/{user}": {
            "get": _op("Get a user's permissions in a virtual host", _ok(_ref("Permission")), 404,
                       params=[VHOST, USER], tag="users", description=ADMIN_ONLY),
            "put": _op("Set a user's permissions in a virtual host",
                       {**_ok(_ref("Permission"), "Changed"), **_ok(_ref("Permission"), "Created", 201)},
                       400, 404, 409, 415, params=[VHOST, USER], tag="users",
                       body={"required": True, "content": _json(_ref("PermissionDeclaration"))},
                       description=ADMIN_ONLY + " " + RUNTIME_CHANGE),
            "delete": _op("Remove a user's permissions in a virtual host", _ok({
                "type": "object", "required": ["deleted"], "properties": {"deleted": {"type": "object"}}}),
                404, 409, params=[VHOST, USER], tag="users", description=ADMIN_ONLY + " " + RUNTIME_CHANGE),
        },
    }
    definitions_paths, definitions_schemas = _definitions()
    paths.update(definitions_paths)
    _link(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "QMQ HTTP API",
            "version": "1",
            "description": "JSON and Avro over HTTP: publish, receive with long polls, ack by receipt handle, "
            "follow topics, manage queues, exchanges and bindings. Errors are RFC 9457 problem documents.",
        },
        "paths": paths,
        "components": {
            "schemas": {**_schemas(s), **definitions_schemas},
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic", "description": "A user of the broker ([users])."},
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                           "description": "A token of the virtual host ([vhosts.NAME.tokens])."},
            },
        },
        "security": [{}, {"basic": []}, {"bearer": []}],
    }


def _definitions() -> tuple[dict, dict]:
    """C{/api/v1/definitions} (L{qmq.web.api.definitions}): its paths and schemas."""
    name = NAME
    # A user's name: the core's import takes at most 128 characters.
    user = {**NAME, "maxLength": 128}
    arguments = {"type": "object", "default": {}}
    item = {"type": "object", "additionalProperties": False}
    schemas = {
        "Definitions": {
            "type": "object",
            "additionalProperties": False,
            "description": "A broker's users, virtual hosts, permissions, exchanges, queues and bindings "
            "(docs/http-api.rst). The broker's own exchanges and queues (amq.*, exclusive queues, durable "
            "subscriptions' durable.* queues) are left out.",
            "properties": {
                "qmq_version": {"type": "string", "description": "The exporting broker's version."},
                **_WHOLE,
                "users": {"type": "array", "items": {**item, "required": ["name"], "properties": {
                    "name": user,
                    "password_hash": {"type": ["string", "null"], "pattern": SCRYPT_HASH,
                                      "description": "The scrypt hash (as qmq-passwd prints it); null: no "
                                      "password login."},
                    "certificate_names": {"type": "array", "items": name, "default": []}}}},
                "vhosts": {"type": "array", "items": {**item, "required": ["name"], "properties": {"name": name}}},
                "permissions": {"type": "array", "items": {**item, "required": ["vhost", "user"], "properties": {
                    "vhost": name, "user": user, "configure": PATTERN, "write": PATTERN, "read": PATTERN}}},
                "exchanges": {"type": "array", "items": {**item, "required": ["vhost", "name", "type"],
                                                         "properties": {
                    "vhost": name, "name": EXCHANGE_NAME, "type": {"enum": ["direct", "fanout", "topic", "headers"]},
                    "durable": {"type": "boolean", "default": True},
                    "auto_delete": {"type": "boolean", "default": False},
                    "internal": {"type": "boolean", "default": False}, "arguments": EXCHANGE_ARGUMENTS}}},
                "queues": {"type": "array", "items": {**item, "required": ["vhost", "name"], "properties": {
                    "vhost": name, "name": NAME, "durable": {"type": "boolean", "default": True},
                    "auto_delete": {"type": "boolean", "default": False}, "arguments": arguments}}},
                "bindings": {"type": "array", "items": {**item, "required": ["vhost", "source", "destination"],
                                                        "properties": {
                    "vhost": name, "source": EXCHANGE_NAME, "destination": NAME,
                    "destination_type": {"enum": ["queue", "exchange"], "default": "queue"},
                    "routing_key": {**KEY, "default": ""}, "arguments": arguments}}},
            },
        },
        "DefinitionsImported": {
            "type": "object",
            "required": ["created", "unchanged"],
            "properties": {
                "created": {"type": "object", "additionalProperties": {"type": "integer"}},
                "unchanged": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        },
    }
    paths = {
        "/api/v1/definitions": {
            "get": _op("Export definitions", _ok(_ref("Definitions")), tag="management",
                       description=ADMIN_ONLY + " Exchanges and queues the caller may not read are left out. "
                       "With workers or in a mesh: the whole broker's, each queue and its bindings from its "
                       "home; 'missing' names the nodes that did not answer (their queues are not in it)."),
            "post": _op("Import definitions", _ok(_ref("DefinitionsImported")), 409, 415, 503, tag="management",
                        body={"required": True, "content": _json(_ref("Definitions"))},
                        description=ADMIN_ONLY + " Makes what the document has and the broker has not; what "
                        "exists and agrees is left as it is, so importing twice changes nothing. 409 "
                        "(code definitions-conflict, the item in 'item'): an item disagrees with the broker "
                        "(a queue with other arguments, an exchange of another type, other permissions, a "
                        "virtual host it does not have), and nothing was changed. A user the broker has is "
                        "left as it is. 400 (code "
                        "bad-definitions): the document is malformed. Users and permissions are kept in memory "
                        "only, as with PUT /api/v1/users. With workers or in a mesh: planned with what every "
                        "node holds (503, code node-unavailable, 'missing' naming them: a node did not answer, "
                        "nothing was changed); each queue is declared and bound on its home, and the answer "
                        "waits for the homes' (their refusal: its problem, naming the item)."),
        },
    }
    return paths, schemas
