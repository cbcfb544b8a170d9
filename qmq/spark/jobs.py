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
import math
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from qmq.spark import session
from qmq.spark.progress import Progress, StageWatch

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


def archive_batch(spark: Any, df: Any, out: str) -> tuple[int, int]:
    """Append to the archive at C{out} the rows of C{df} (message columns)
    it does not hold yet (by queue and message id); return how many rows
    were read and how many added.

    Both counts come from one pass: the rows read are joined to the held
    keys with a mark, kept (memory, then disk) and counted by the mark,
    then the unmarked ones written; the source is read once."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    rows = df.withColumn("date", F.to_date("timestamp"))
    if _has_parquet(out):
        dates = rows.select("date").distinct()
        held = (spark.read.parquet(out).select("queue", "message_id", "date")
                .join(F.broadcast(dates), "date", "left_semi").drop("date")
                .dropDuplicates(["queue", "message_id"])
                .withColumn("_held", F.lit(True)))
        rows = rows.join(held, ["queue", "message_id"], "left")
    else:
        rows = rows.withColumn("_held", F.lit(None).cast("boolean"))
    rows = rows.persist()
    try:
        counts = rows.groupBy(F.col("_held").isNull().alias("new")).count().collect()
        by = {bool(r["new"]): int(r["count"]) for r in counts}
        read, added = sum(by.values()), by.get(True, 0)
        if added:
            (rows.where(F.col("_held").isNull()).drop("_held")
             .write.mode("append").partitionBy("destination", "date").parquet(out))
        return read, added
    finally:
        rows.unpersist()


def _has_parquet(path: str) -> bool:
    files = _parquet_files(path)
    return files is None or bool(files)


def _parquet_files(path: str) -> set[str] | None:
    """The Parquet files under a local C{path} (None: a remote file system,
    not looked at)."""
    if "://" in path and not path.startswith("file:"):
        return None  # a remote file system: let Spark tell
    path = path.removeprefix("file:")
    found: set[str] = set()
    if not os.path.isdir(path):
        return found
    for root, _dirs, files in os.walk(path):
        found.update(os.path.join(root, f) for f in files if f.endswith(".parquet"))
    return found


def archive(spark: Any, args: argparse.Namespace, progress: Progress | None = None) -> int:
    """The archive job; the rows it added.  C{progress} (made if not given)
    hears each micro-batch and ends with the summary line."""
    progress = progress or Progress("archive", 0)
    before = _parquet_files(args.out)
    read, added = [0], [0]
    with StageWatch(spark.sparkContext, progress):
        if args.checkpoint:

            def batch(df: Any, batch_id: int) -> None:
                r, a = archive_batch(df.sparkSession, df, args.out)
                read[0] += r
                added[0] += a
                progress.note(f"micro-batch {batch_id}: {r:,} row(s) read, {a:,} added; "
                              f"{read[0]:,} read, {added[0]:,} added in all")

            r = _reader(spark, args, stream=True)
            if args.max_rows:
                r = r.option("maxRowsPerTrigger", str(args.max_rows))
            q = (r.load().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", args.checkpoint)
                 .trigger(availableNow=True).start())
            q.awaitTermination()
        else:
            read[0], added[0] = archive_batch(spark, _reader(spark, args).load(), args.out)
    after = _parquet_files(args.out)
    files = None if before is None or after is None else len(after - before)
    progress.summary(read[0], added[0], files, written_as="added")
    return added[0]


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


def report(spark: Any, args: argparse.Namespace,
           progress: Progress | None = None) -> dict[str, str]:
    """The report job; the files it wrote, by kind.  C{progress} (made if
    not given) hears the steps and ends with the summary line."""
    progress = progress or Progress("report", 0)
    per_minute, top = report_frames(spark, args)
    out = args.out
    os.makedirs(out, exist_ok=True)
    with StageWatch(spark.sparkContext, progress):
        per_minute.write.mode("overwrite").parquet(os.path.join(out, "per_minute"))
        progress.note("per_minute/ written")
        top.write.mode("overwrite").parquet(os.path.join(out, "top_producers"))
        minutes = [r.asDict() for r in per_minute.collect()]
        producers = [r.asDict() for r in top.collect()]
    files = {
        "per_minute_csv": _csv(os.path.join(out, "per_minute.csv"), per_minute.columns, minutes),
        "top_producers_csv": _csv(os.path.join(out, "top_producers.csv"), top.columns, producers),
    }
    files["chart"] = _chart(os.path.join(out, "report.png"), minutes)
    files["html"] = _html(os.path.join(out, "report.html"), minutes, producers, files["chart"])
    parts = [_parquet_files(os.path.join(out, d)) for d in ("per_minute", "top_producers")]
    count = None if None in parts else len(files) + sum(len(p) for p in parts if p is not None)
    progress.summary(sum(r["messages"] for r in minutes), len(minutes) + len(producers), count)
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


#: The chart draws this many destinations at most (the busiest); the rest
#: are in the CSV and the page's table.
CHART_DESTINATIONS = 12

#: The chart's columns: a per-minute field, its label and a scale.
_PANELS = (("messages", "messages / minute", 1.0),
           ("bytes", "KiB / minute", 1 / 1024),
           ("ack_delay_p50_ms", "publish to ack, p50 (ms)", 1.0))


def chart_series(rows: list[dict], limit: int = CHART_DESTINATIONS
                 ) -> tuple[dict[str, dict[str, list]], list[str]]:
    """What the chart draws: per destination (the C{limit} busiest, by
    messages), the minutes and each panel's values, in minute order; and
    the destinations left out.

    A minute without traffic has no row; between two rows more than a
    minute apart the series get a point one minute after the first whose
    values are NaN, so matplotlib breaks the line there (a gap is a gap,
    not a slope).  An unknown value (None) is NaN too.
    """
    nan = float("nan")
    by_dest: dict[str, list[dict]] = {}
    for r in rows:
        by_dest.setdefault(r["destination"], []).append(r)
    ranked = sorted(by_dest, key=lambda d: (-sum(r["messages"] for r in by_dest[d]), d))
    series: dict[str, dict[str, list]] = {}
    for dest in sorted(ranked[:limit]):
        s: dict[str, list] = {"minute": [], **{k: [] for k, _, _ in _PANELS}}
        prev = None
        for r in sorted(by_dest[dest], key=lambda r: r["minute"]):
            if prev is not None and r["minute"] - prev > timedelta(minutes=1):
                s["minute"].append(prev + timedelta(minutes=1))
                for k, _, _ in _PANELS:
                    s[k].append(nan)
            s["minute"].append(r["minute"])
            for k, _, scale in _PANELS:
                s[k].append(nan if r[k] is None else r[k] * scale)
            prev = r["minute"]
        series[dest] = s
    return series, sorted(ranked[limit:])


def _chart(path: str, rows: list[dict]) -> str:
    """Small multiples: a row per destination, a column per panel, each
    with its own y scale (a 200K-message queue does not flatten the small
    ones), sharing the time axis."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    series, left_out = chart_series(rows)
    n = max(1, len(series))
    fig, axes = plt.subplots(n, len(_PANELS), figsize=(12, 1.2 + 2.0 * n), sharex=True,
                             squeeze=False)
    for row, (dest, s) in enumerate(series.items()):
        for col, (key, label, _) in enumerate(_PANELS):
            ax = axes[row][col]
            ax.plot(s["minute"], s[key], marker="o", markersize=3)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
            if all(math.isnan(v) for v in s[key]):
                ax.text(0.5, 0.5, "not known", transform=ax.transAxes, ha="center",
                        va="center", color="#888")
            if row == 0:
                ax.set_title(label, fontsize="medium")
            if col == 0:
                ax.set_ylabel(dest, fontsize="small")
    title = "QMQ traffic per destination and minute"
    if left_out:
        title += f" ({len(left_out)} quieter destination(s) in per_minute.csv)"
    fig.suptitle(title)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
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
        j.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                       help="progress lines on standard error at most this often "
                            "(0: none; the summary line is always written)")
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
    progress = Progress(args.job, args.progress)
    # The job's own progress lines replace Spark's console bar (which would
    # draw over them on the same terminal).
    spark = session(_master(args.master), f"qmq-{args.job}",
                    **{"spark.ui.showConsoleProgress": "false"})
    if args.job == "archive":
        n = archive(spark, args, progress)
        print(f"archived {n} new row(s) into {args.out}")
    else:
        files = report(spark, args, progress)
        for kind, path in files.items():
            print(f"{kind}: {path}")
    return 0


def main_exit() -> None:
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
