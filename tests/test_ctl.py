"""Tests for L{qmq.ctl} against the real API site in this process (the
client is synchronous: it runs in a thread while the reactor serves):
listings read every page, the table's shape, problems as one line, and
the command line's own errors."""

from __future__ import annotations

import io
import json

from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from qmq import ctl
from qmq.web.api.settings import ApiSettings
from tests.web_api_helpers import ApiSiteMixin


class CtlSiteTests(ApiSiteMixin, unittest.TestCase):
    def setUp(self) -> None:
        # Two items a page: a listing of five queues takes three requests.
        self.start_site(settings=ApiSettings(max_list=2))
        for name in ("a", "b", "c", "d", "e"):
            self.broker.default_vhost.declare_queue(name)

    def run_ctl(self, *argv: str) -> defer.Deferred:
        out, err = io.StringIO(), io.StringIO()

        def run() -> tuple[int, str, str]:
            status = ctl.main(["--url", self.base, *argv], stdout=out, stderr=err, stdin=io.StringIO())
            return status, out.getvalue(), err.getvalue()

        return deferToThread(run)

    @defer.inlineCallbacks
    def test_everyPage(self) -> None:
        status, out, _ = yield self.run_ctl("list", "queues", "--json")
        self.assertEqual(status, 0)
        self.assertEqual([q["name"] for q in json.loads(out)], ["a", "b", "c", "d", "e"])

    @defer.inlineCallbacks
    def test_table(self) -> None:
        status, out, _ = yield self.run_ctl("list", "queues")
        lines = out.splitlines()
        self.assertEqual(lines[0], "name  messages_ready  messages_unacknowledged  consumers  durable  auto_delete")
        self.assertEqual(lines[1], "a     0               0                        0          yes      no")
        self.assertEqual(len(lines), 6)

    @defer.inlineCallbacks
    def test_problem(self) -> None:
        status, out, err = yield self.run_ctl("--vhost", "nowhere", "list", "queues")
        self.assertEqual((status, out), (ctl.EXIT_REFUSED, ""))
        self.assertEqual(err, "qmq-ctl: 404 Not Found: No virtual host 'nowhere'.\n")

    @defer.inlineCallbacks
    def test_notQmq(self) -> None:
        """A web server that is not QMQ's answers HTML: said so, exit 3."""
        from twisted.internet import reactor  # noqa: PLC0415
        from twisted.web.resource import Resource  # noqa: PLC0415
        from twisted.web.server import Site  # noqa: PLC0415
        from twisted.web.static import Data  # noqa: PLC0415

        root = Resource()
        root.putChild(b"api", Data(b"<html>hello</html>", "text/html"))
        root.children[b"api"].isLeaf = True
        port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        other = f"http://127.0.0.1:{port.getHost().port}"
        status, _, err = yield self.run_ctl("--url", other, "list", "queues")
        self.assertEqual(status, ctl.EXIT_UNREACHABLE)
        self.assertIn("is it a QMQ http: listener?", err)


class CommandLineTests(unittest.SynchronousTestCase):
    def test_usage(self) -> None:
        err = io.StringIO()
        self.patch(ctl.sys, "stderr", err)
        e = self.assertRaises(SystemExit, ctl.main, ["list"])
        self.assertEqual(e.code, ctl.EXIT_USAGE)
        self.assertIn("qmq-ctl list: the following arguments are required: what", err.getvalue())

    def test_userWithoutPassword(self) -> None:
        err = io.StringIO()
        status = ctl.main(["--user", "admin", "list", "queues"], stdout=io.StringIO(), stderr=err,
                          stdin=io.StringIO())
        self.assertEqual(status, ctl.EXIT_USAGE)
        self.assertEqual(err.getvalue(), "qmq-ctl: --user needs --password (or QMQ_CTL_PASSWORD)\n")

    def test_badUrl(self) -> None:
        for url in ("foo", "ftp://broker", "http://"):
            err = io.StringIO()
            status = ctl.main(["--url", url, "list", "queues"], stdout=io.StringIO(), stderr=err,
                              stdin=io.StringIO())
            self.assertEqual(status, ctl.EXIT_USAGE, url)
            self.assertEqual(err.getvalue(),
                             f"qmq-ctl: --url {url!r}: expected http://HOST:PORT or https://HOST:PORT\n")

    def test_environment(self) -> None:
        self.patch(ctl.os, "environ", {"QMQ_CTL_URL": "http://broker:1", "QMQ_CTL_USER": "u",
                                       "QMQ_CTL_PASSWORD": "p", "QMQ_CTL_TOKEN": "t"})
        args = ctl.parser().parse_args(["health"])
        self.assertEqual((args.url, args.user, args.password, args.token), ("http://broker:1", "u", "p", "t"))

    def test_table(self) -> None:
        self.assertEqual(ctl.table([{"a": True, "b": ["x", "y"], "c": None}], ("a", "b", "c")),
                         "a    b    c\nyes  x,y\n")

    def test_whole_broker_listing(self) -> None:
        """With workers (a mesh), a listing shows each queue's home; a node
        that did not answer is named on standard error, with exit status 3."""
        answers = [{"queues": [{"name": "q1", "home": "w0"}, {"name": "q2", "home": "w1"}],
                    "offset": 0, "next_offset": None, "total": 2, "missing": {"w2": "node 'w2' did not answer"}}]
        client = ctl.Client("http://broker:1")
        self.patch(client, "request", lambda method, path, query=None, body=None: answers.pop(0))
        out, err = io.StringIO(), io.StringIO()
        args = ctl.parser().parse_args(["list", "queues"])
        self.assertEqual(ctl.cmd_list(client, args, out, err), ctl.EXIT_UNREACHABLE)
        lines = out.getvalue().splitlines()
        self.assertTrue(lines[0].split()[-1] == "home" and lines[1].split()[-1] == "w0", lines)
        self.assertIn("node w2 did not answer (node 'w2' did not answer): its queues are not listed", err.getvalue())

    def test_partial_export(self) -> None:
        """An export that lacks a node's queues prints what it got, names
        the node on standard error and exits with status 3."""
        doc = {"queues": [{"vhost": "/", "name": "q1"}], "missing": {"w1": "node 'w1' did not answer within 5 s"}}
        client = ctl.Client("http://broker:1")
        self.patch(client, "request", lambda method, path, query=None, body=None: doc)
        out, err = io.StringIO(), io.StringIO()
        args = ctl.parser().parse_args(["export", "definitions"])
        self.assertEqual(ctl.cmd_export(client, args, out, err), ctl.EXIT_UNREACHABLE)
        self.assertEqual(json.loads(out.getvalue()), doc)
        self.assertEqual(err.getvalue(), "qmq-ctl: node w1 did not answer (node 'w1' did not answer within 5 s): "
                         "its queues are not exported\n")
        doc["missing"] = {}
        self.assertEqual(ctl.cmd_export(client, args, io.StringIO(), err), ctl.EXIT_OK)
