"""``calpipe spark-run``: the nightly step on Spark, for ``spark-submit`` (extra ``calpipe[spark]``).

Reads a landing folder of scored events (``date=YYYY-MM-DD/*.parquet``), runs the days in order
with :func:`calpipe.spark.run_days` (each day from the state of the day before under ``--out``)
and writes ``OUT/scores``, ``OUT/state`` and ``OUT/daily`` as Parquet partitioned by ``date``,
a day's partitions replaced by a dynamic partition overwrite (re-running a day rewrites it), or
as Delta tables with ``--table-format delta`` (a day replaced by ``replaceWhere``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from calpipe.cli.options import add_method_options, method_params


def _cmd_spark_run(args: argparse.Namespace) -> int:
    from calpipe import spark as cs
    from calpipe.spark import landing_days

    t0 = time.perf_counter()
    params = method_params(args)
    if args.scores:
        params["scores"] = args.scores
    if args.label_time_col:
        params["label_time"] = args.label_time_col
    days = landing_days(args.events)
    if not days:
        print(f"calpipe: nothing to run: no date=YYYY-MM-DD folders in {args.events}")
        return 0
    start, end = args.start or days[0], args.end or days[-1]
    session = cs.session(args.master)
    present = set(days)
    schema = session.read.parquet(f"{args.events}/date={days[0].isoformat()}").schema

    def read(d: dt.date):
        if d not in present:  # a day without events is still a day of the chain
            return session.createDataFrame([], schema)
        return session.read.parquet(f"{args.events}/date={d.isoformat()}")

    done = cs.run_days(
        session, read, args.out, start, end, first_day=args.first_day or days[0],
        method=args.method, by=args.by, n_buckets=args.n_buckets,
        table_format=args.table_format,
        log=lambda m: print(f"  {m}", flush=True), **params,
    )  # fmt: skip
    print(
        f"calpipe spark-run: {len(done)} day(s) {start}..{end} in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def register(sub) -> None:
    """Add ``spark-run`` to the ``calpipe`` sub-command parser."""
    from calpipe.spark import TABLE_FORMATS  # pyspark itself is imported only when run

    r = sub.add_parser("spark-run", help="the nightly step on Spark (spark-submit; calpipe[spark])")
    r.add_argument("--events", required=True, help="landing folder (date=YYYY-MM-DD/*.parquet)")
    r.add_argument("--out", required=True, help="output folder: scores/, state/, daily/ by date")
    r.add_argument("--start", type=dt.date.fromisoformat, help="first day (default: the first)")
    r.add_argument("--end", type=dt.date.fromisoformat, help="last day (default: the last)")
    r.add_argument("--first-day", type=dt.date.fromisoformat,
                   help="the chain's first day (default: the landing's first day)")  # fmt: skip
    r.add_argument("--master", default="local[*]",
                   help="Spark master when not under spark-submit (default local[*])")  # fmt: skip
    r.add_argument("--by", default="stream", help="stream key column (default stream)")
    r.add_argument("--table-format", choices=TABLE_FORMATS, default="parquet",
                   help="parquet (dynamic partition overwrite) or delta (replaceWhere; needs "
                        "Delta Lake on the session)")  # fmt: skip
    r.add_argument("--scores", help="K-class forecasts: the list column (instead of score)")
    r.add_argument("--label-time-col", help="delayed labels: when each label became known")
    r.add_argument("--n-buckets", type=int,
                   help="stream buckets, one engine call each (default: 4 per core)")  # fmt: skip
    add_method_options(r)
    r.set_defaults(func=_cmd_spark_run)
