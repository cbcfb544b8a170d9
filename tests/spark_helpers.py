"""Helpers of the Spark tests: one local[2] SparkSession per test process,
a broker with the HTTP API and a commit log on a temporary directory, and
running Spark's blocking calls off the reactor thread (the broker serves
the HTTP API on the reactor meanwhile)."""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.internet import defer, reactor, threads

from qmq.core.broker import Broker
from tests.web_api_helpers import ApiSiteMixin

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - CI installs the extra
    SKIP: str | None = f"the Spark tests need the spark extra (pip install '.[spark]'): {e}"
else:
    SKIP = None

_SESSION: Any = None


def spark_session() -> Any:
    """The process's one local[2] SparkSession (made on first use; Spark
    stops it when the process exits)."""
    global _SESSION
    if _SESSION is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        from qmq.spark import session  # noqa: PLC0415

        _SESSION = session(
            "local[2]",
            "qmq-tests",
            **{
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.sql.session.timeZone": "UTC",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            },
        )
        _SESSION.sparkContext.setLogLevel("ERROR")
    return _SESSION


def in_thread(f: Any, *args: Any, **kwargs: Any) -> defer.Deferred:
    """Run a blocking Spark call in a thread; its result as a Deferred.

    The JVM's active session is per thread, and writes look their data
    source up through it: the thread makes the test session active first.
    """

    def call() -> Any:
        from pyspark.sql import SparkSession  # noqa: PLC0415

        spark = spark_session()
        SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
        return f(*args, **kwargs)

    return threads.deferToThread(call)


class BrokerSiteMixin(ApiSiteMixin):
    """A broker with a commit log in a temporary directory and its HTTP
    listener on 127.0.0.1 (C{self.base} is the URL, C{self.data} the log
    directory)."""

    def start_broker(self) -> None:
        from qmq.store.log import CommitLogStore  # noqa: PLC0415

        self.data = os.path.abspath(self.mktemp())
        os.makedirs(self.data)
        self.store = CommitLogStore(self.data, reactor=reactor, compact_interval=0)
        self.start_site(broker=Broker(reactor, store=self.store))
        self.addCleanup(self.store.close)
        # Spark's threads make blocking requests: the pool must be big enough.
        reactor.suggestThreadPoolSize(8)

    @property
    def vhost(self) -> Any:
        return self.broker.default_vhost

    @defer.inlineCallbacks
    def publish(self, queue: str, messages: list[dict]) -> Any:
        """Publish C{messages} (JSON message objects) to C{queue}, persistent,
        in one batch; their numbers (the ids are NODE.NUMBER; Spark's
        C{message_id} is the number)."""
        for m in messages:
            m.setdefault("persistent", True)
        code, _, _, doc = yield self.call(
            "POST", f"/api/v1/vhosts/%2F/queues/{queue}/messages", {"messages": messages},
            check=False)
        assert code == 201, (code, doc)
        return [int(i.rpartition(".")[2]) for i in doc["ids"]]
