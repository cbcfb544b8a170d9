# -*- test-case-name: tests.test_spark_jobs -*-
"""QMQ's pipeline jobs on Spark: archive and report (docs/spark.rst, "Jobs").

Run them with the console script (``qmq-spark archive ...``, ``local[*]``
unless ``--master`` says otherwise) or with ``spark-submit`` on any cluster
(``spark-submit .../qmq/spark/jobs.py archive ...``: the master is then
spark-submit's).

archive
    Copies queues' messages into Parquet partitioned by ``destination`` and
    ``date``, incrementally: each run appends only the rows (queue,
    message id) the archive does not have yet, so running it twice over one
    range adds nothing. With ``--checkpoint`` it is a streaming query
    (``availableNow``: reads what is new since the last run, then stops)
    whose micro-batches are appended the same way, so a micro-batch
    replayed after a crash adds nothing either.
report
    Per destination and minute: messages, bytes, acks, publish-to-ack
    delay (where the log knows the ack time: queues with ``x-retention``),
    redelivery and dead-letter rates; the top producers (a header) per
    destination. Written as Parquet and CSV, a PNG chart and an HTML page.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from qmq.spark import session

# -- reading ------------------------------------------------------------------------------


def _reader(spark: Any, args: argparse.Namespace, stream: bool = False) -> Any:
    r = (spark.readStream if stream else spark.read).format("qmq")
    options = {
        "url": args.url,
        "path": args.path,
        "vhost": args.vhost,
        "destinations": args.destinations,
        "pattern": args.pattern,
        "startingTimestamp": args.start,
        "endingTimestamp": args.end,
        "user": args.user,
        "password": args.password,
        "token": args.token,
        "partitionsPerDestination": getattr(args, "slices", None),
    }
    for k, v in options.items():
        if v is not None:
            r = r.option(k, str(v))
    return r


# -- archive ------------------------------------------------------------------------------


def archive_batch(spark: Any, df: Any, out: str) -> int:
    """Append to the archive at C{out} the rows of C{df} (message columns)
    it does not hold yet (by queue and message id); return how many."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    rows = df.withColumn("date", F.to_date("timestamp"))
    if _has_parquet(out):
        dates = rows.select("date").distinct()
        held = (spark.read.parquet(out).select("queue", "message_id", "date")
                .join(F.broadcast(dates), "date", "left_semi").drop("date"))
        rows = rows.join(held, ["queue", "message_id"], "left_anti")
    rows = rows.persist()
    try:
        n = rows.count()
        if n:
            rows.write.mode("append").partitionBy("destination", "date").parquet(out)
        return int(n)
    finally:
        rows.unpersist()


def _has_parquet(path: str) -> bool:
    if "://" in path and not path.startswith("file:"):
        return True  # a remote file system: let Spark tell
    path = path.removeprefix("file:")
    if not os.path.isdir(path):
        return False
    for _root, _dirs, files in os.walk(path):
        if any(f.endswith(".parquet") for f in files):
            return True
    return False


def archive(spark: Any, args: argparse.Namespace) -> int:
    """The archive job; the rows it added."""
    if args.checkpoint:
        added = [0]

        def batch(df: Any, batch_id: int) -> None:
            added[0] += archive_batch(df.sparkSession, df, args.out)

        r = _reader(spark, args, stream=True)
        if args.max_rows:
            r = r.option("maxRowsPerTrigger", str(args.max_rows))
        q = (r.load().writeStream.foreachBatch(batch)
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
        q.awaitTermination()
        return added[0]
    return archive_batch(spark, _reader(spark, args).load(), args.out)


# -- report -------------------------------------------------------------------------------


def report_frames(spark: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """The report's two tables: per destination and minute, and the top
    producers per destination."""
    from pyspark.sql import Window  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415

    if args.path:
        events = (_reader(spark, args).option("records", "events")
                  .option("producerHeader", args.producer_header).load())
        publishes = (events.where("kind = 'publish'")
                     .select("vhost", "queue", "message_id", "timestamp", "bytes", "producer"))
        retention = (events.where("kind = 'declare'").groupBy("vhost", "queue")
                     .agg(F.max("retention").alias("retention")))
        settles = (events.where("kind = 'settle'").groupBy("vhost", "queue", "message_id")
                   .agg(F.max(F.when(F.col("reason") == "ack", F.col("kept_until"))).alias("kept"),
                        F.max((F.col("reason") == "ack").cast("int")).alias("acked"),
                        F.max((F.col("reason") == "dead-letter").cast("int")).alias("dead")))
        requeues = (events.where("kind = 'requeue'").groupBy("vhost", "queue", "message_id")
                    .agg(F.count(F.lit(1)).alias("requeues")))
        msgs = (publishes.dropDuplicates(["vhost", "queue", "message_id"])
                .join(settles, ["vhost", "queue", "message_id"], "left")
                .join(requeues, ["vhost", "queue", "message_id"], "left")
                .join(retention, ["vhost", "queue"], "left"))
        ack_time = F.col("kept").cast("double") - F.col("retention")
        msgs = (msgs.withColumn("acked", F.coalesce("acked", F.lit(0)))
                .withColumn("dead", F.coalesce("dead", F.lit(0)))
                .withColumn("redelivered", (F.coalesce("requeues", F.lit(0)) > 0).cast("int")))
        msgs = msgs.withColumn(
            "ack_delay_ms",
            F.when(F.col("kept").isNotNull() & F.col("retention").isNotNull(),
                   (ack_time - F.col("timestamp").cast("double")) * 1000))
    else:
        msgs = (_reader(spark, args).load()
                .select("queue", "message_id", "timestamp",
                        F.length("body").cast("long").alias("bytes"),
                        F.col("headers")[args.producer_header].alias("producer"))
                .withColumn("acked", F.lit(None).cast("int"))
                .withColumn("dead", F.lit(None).cast("int"))
                .withColumn("redelivered", F.lit(None).cast("int"))
                .withColumn("ack_delay_ms", F.lit(None).cast("double")))
    msgs = (msgs.withColumn("destination", F.concat(F.lit("/queue/"), F.col("queue")))
            .withColumn("minute", F.date_trunc("minute", "timestamp")))
    per_minute = (
        msgs.groupBy("destination", "minute")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.sum("acked").alias("acked"),
            F.avg("ack_delay_ms").alias("ack_delay_avg_ms"),
            F.percentile_approx("ack_delay_ms", 0.5).alias("ack_delay_p50_ms"),
            F.max("ack_delay_ms").alias("ack_delay_max_ms"),
            F.sum("redelivered").alias("redelivered"),
            F.sum("dead").alias("dead_lettered"),
        )
        .withColumn("redelivery_rate", F.col("redelivered") / F.col("messages"))
        .withColumn("dead_letter_rate", F.col("dead_lettered") / F.col("messages"))
        .orderBy("destination", "minute")
    )
    producers = (msgs.groupBy("destination", F.coalesce("producer", F.lit("(none)")).alias("producer"))
                 .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes")))
    rank = Window.partitionBy("destination").orderBy(F.desc("messages"), F.asc("producer"))
    top = (producers.withColumn("rank", F.row_number().over(rank))
           .where(F.col("rank") <= args.top).orderBy("destination", "rank"))
    return per_minute, top


def report(spark: Any, args: argparse.Namespace) -> dict[str, str]:
    """The report job; the files it wrote, by kind."""
    per_minute, top = report_frames(spark, args)
    out = args.out
    os.makedirs(out, exist_ok=True)
    per_minute.write.mode("overwrite").parquet(os.path.join(out, "per_minute"))
    top.write.mode("overwrite").parquet(os.path.join(out, "top_producers"))
    minutes = [r.asDict() for r in per_minute.collect()]
    producers = [r.asDict() for r in top.collect()]
    files = {
        "per_minute_csv": _csv(os.path.join(out, "per_minute.csv"), per_minute.columns, minutes),
        "top_producers_csv": _csv(os.path.join(out, "top_producers.csv"), top.columns, producers),
    }
    files["chart"] = _chart(os.path.join(out, "report.png"), minutes)
    files["html"] = _html(os.path.join(out, "report.html"), minutes, producers, files["chart"])
    return files


def _csv(path: str, columns: list[str], rows: list[dict]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r[c]) for c in columns])
    return path


def _cell(v: Any) -> Any:
    """A CSV cell: timestamps in UTC (PySpark gives naive local times)."""
    if v is None:
        return ""
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return v


def _chart(path: str, rows: list[dict]) -> str:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    by_dest: dict[str, list[dict]] = {}
    for r in rows:
        by_dest.setdefault(r["destination"], []).append(r)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for dest, rs in sorted(by_dest.items()):
        xs = [r["minute"] for r in rs]
        axes[0].plot(xs, [r["messages"] for r in rs], marker="o", label=dest)
        axes[1].plot(xs, [(r["bytes"] or 0) / 1024 for r in rs], marker="o", label=dest)
        axes[2].plot(xs, [r["ack_delay_p50_ms"] for r in rs], marker="o", label=dest)
    axes[0].set_ylabel("messages / minute")
    axes[1].set_ylabel("KiB / minute")
    axes[2].set_ylabel("publish to ack, p50 (ms)")
    axes[0].set_title("QMQ traffic per destination")
    if by_dest:
        axes[0].legend(fontsize="small")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _fmt(v: Any) -> str:
    if v is None:
        return "&ndash;"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _html(path: str, minutes: list[dict], producers: list[dict], chart: str) -> str:
    totals: dict[str, dict[str, Any]] = {}
    for r in minutes:
        t = totals.setdefault(r["destination"], {"messages": 0, "bytes": 0, "acked": None,
                                                   "redelivered": None, "dead_lettered": None,
                                                   "minutes": 0, "peak": 0})
        t["messages"] += r["messages"]
        t["bytes"] += r["bytes"] or 0
        t["minutes"] += 1
        t["peak"] = max(t["peak"], r["messages"])
        for k in ("acked", "redelivered", "dead_lettered"):
            if r[k] is not None:
                t[k] = (t[k] or 0) + r[k]
    with open(chart, "rb") as f:
        png = base64.b64encode(f.read()).decode()
    head = ("<tr><th>destination</th><th>messages</th><th>bytes</th><th>minutes</th>"
            "<th>peak / minute</th><th>acked</th><th>redelivered</th><th>dead-lettered</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(d)}</td><td>{_fmt(t['messages'])}</td><td>{_fmt(t['bytes'])}</td>"
        f"<td>{_fmt(t['minutes'])}</td><td>{_fmt(t['peak'])}</td><td>{_fmt(t['acked'])}</td>"
        f"<td>{_fmt(t['redelivered'])}</td><td>{_fmt(t['dead_lettered'])}</td></tr>"
        for d, t in sorted(totals.items()))
    prod = "".join(
        f"<tr><td>{html.escape(p['destination'])}</td><td>{p['rank']}</td>"
        f"<td>{html.escape(p['producer'])}</td><td>{_fmt(p['messages'])}</td>"
        f"<td>{_fmt(p['bytes'])}</td></tr>" for p in producers)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>QMQ traffic report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child {{ text-align: left; }}
</style></head><body>
<h1>QMQ traffic report</h1>
<h2>Destinations</h2>
<table>{head}{body}</table>
<img alt="messages, bytes and publish-to-ack delay per minute" src="data:image/png;base64,{png}">
<h2>Top producers</h2>
<table><tr><th>destination</th><th>rank</th><th>producer</th><th>messages</th><th>bytes</th></tr>{prod}</table>
<p>Per minute figures: per_minute.csv (and Parquet in per_minute/); a dash: not known
(acks and redeliveries come from segment files; the ack time from queues with x-retention).</p>
</body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


# -- the command line ---------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qmq-spark", description="QMQ's Spark jobs (docs/spark.rst)")
    p.add_argument("--master", default=None,
                   help="Spark master (default: spark-submit's, else local[*])")
    sub = p.add_subparsers(dest="job", required=True)
    for name, text in (("archive", "queues' messages into partitioned Parquet, incrementally"),
                       ("report", "traffic per destination and minute: Parquet, CSV, PNG, HTML")):
        j = sub.add_parser(name, help=text)
        src = j.add_mutually_exclusive_group(required=True)
        src.add_argument("--url", help="the broker's HTTP listener (range scans)")
        src.add_argument("--path", help="a data directory (segment files)")
        j.add_argument("--vhost", default="/")
        j.add_argument("--destinations", help="queues, comma-separated")
        j.add_argument("--pattern", help="a glob over queue names")
        j.add_argument("--start", help="publish time from (epoch seconds or ISO-8601)")
        j.add_argument("--end", help="publish time until, excluded")
        j.add_argument("--user")
        j.add_argument("--password")
        j.add_argument("--token")
        j.add_argument("--slices", type=int, help="time slices per queue (HTTP reads)")
        j.add_argument("--out", required=True, help="the output directory")
        if name == "archive":
            j.add_argument("--checkpoint", help="run as a streaming query with this checkpoint")
            j.add_argument("--max-rows", type=int, help="with --checkpoint: rows per micro-batch")
        else:
            j.add_argument("--top", type=int, default=10, help="producers per destination")
            j.add_argument("--producer-header", default="producer",
                           help="the header naming a message's producer")
    return p


def _master(given: str | None) -> str | None:
    """The master to ask for: C{--master}; else, under C{spark-submit}, None
    (keep spark-submit's: it started the JVM and told this driver its
    gateway); else C{local[*]}."""
    if given:
        return given
    return None if os.environ.get("PYSPARK_GATEWAY_PORT") else "local[*]"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session(_master(args.master), f"qmq-{args.job}")
    if args.job == "archive":
        n = archive(spark, args)
        print(f"archived {n} new row(s) into {args.out}")
    else:
        files = report(spark, args)
        for kind, path in files.items():
            print(f"{kind}: {path}")
    return 0


def main_exit() -> None:
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
