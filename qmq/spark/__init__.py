"""QMQ's data pipeline on Spark: the ``qmq`` PySpark data source and jobs.

Install with ``pip install 'qmq[spark]'`` (pyspark, pyarrow, matplotlib);
the broker never imports this package. docs/spark.rst is the guide.

::

    from qmq.spark import session
    spark = session("local[*]")          # registers the "qmq" data source
    df = (spark.read.format("qmq")
          .option("url", "http://127.0.0.1:8080").option("destination", "orders")
          .load())

In an existing session, ``qmq.spark.register(spark)`` registers it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["register", "session", "message_schema"]


def register(spark: Any) -> Any:
    """Register the ``qmq`` data source in C{spark}; return C{spark}."""
    from qmq.spark.source import QmqDataSource  # noqa: PLC0415

    spark.dataSource.register(QmqDataSource)
    return spark


def session(master: str | None = "local[*]", app_name: str = "qmq", **conf: str) -> Any:
    """A SparkSession with the ``qmq`` data source registered.

    @param master: C{local[*]} by default; None keeps what C{spark-submit}
        (or C{spark.master}) says.
    @param conf: more Spark settings (dots as in Spark's names).

    The Python workers run this interpreter (C{PYSPARK_PYTHON}, unless set)
    so they import the same qmq and pyarrow as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())


def message_schema(body: Any = None) -> Any:
    """The message columns, then C{body}'s (see L{qmq.spark.source.message_schema})."""
    from qmq.spark.source import message_schema as make  # noqa: PLC0415

    return make(body)
