"""``calpipe spark-run``: the nightly run on Spark, for ``spark-submit`` (extra ``calpipe[spark]``).

Reads a landing folder of scored events (``date=YYYY-MM-DD/*.parquet``, the data contract's
names) and, with ``--labels``, a label feed laid out as ``calpipe run --labels`` reads it; runs
the nights in order with :func:`calpipe.spark_run.run_days` (each from the state of the night
before under ``--out``, through the night function ``calpipe run`` calls) and writes every
table of ``calpipe run`` but ``pipeline_inputs`` under ``OUT/<table>`` (Parquet partitioned as
DuckDB stores it, or Delta tables with ``--table-format delta``), each night's partition
replaced whole, and ``OUT/state`` (every stream's state at the end of each night).
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from calpipe.cli.options import add_method_options, method_params
from calpipe.night.settings import Settings


def _cmd_spark_run(args: argparse.Namespace) -> int:
    from calpipe import spark as cs
    from calpipe import spark_run

    t0 = time.perf_counter()
    settings = Settings.make(args.method, **method_params(args))
    days = spark_run.landing_days(args.events)
    if not days:
        print(f"calpipe: nothing to run: no date=YYYY-MM-DD folders in {args.events}")
        return 0
    if args.labels:  # a night with labels and no events is a night too
        days = sorted({*days, *spark_run.landing_days(args.labels)})
    start, end = args.start or days[0], args.end or days[-1]
    session = cs.session(args.master)
    landed = spark_run.landing_days(args.events)
    schema = session.read.parquet(f"{args.events}/date={landed[0].isoformat()}").schema
    present = set(landed)

    def read(d: dt.date):
        if d not in present:  # a day without events is still a day of the chain
            return session.createDataFrame([], schema)
        return session.read.parquet(f"{args.events}/date={d.isoformat()}")

    done = spark_run.run_days(
        session, read, args.out, start, end, settings=settings, labels=args.labels,
        on_unknown_label=args.on_unknown_label, first_day=args.first_day or days[0],
        n_buckets=args.n_buckets, table_format=args.table_format, source=args.events,
        log=lambda m: print(f"  {m}", flush=True),
    )  # fmt: skip
    print(
        f"calpipe spark-run: {len(done)} day(s) {start}..{end} in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def register(sub) -> None:
    """Add ``spark-run`` to the ``calpipe`` sub-command parser."""
    from calpipe.spark_run import TABLE_FORMATS  # pyspark itself is imported only when run

    r = sub.add_parser("spark-run", help="the nightly step on Spark (spark-submit; calpipe[spark])")
    r.add_argument("--events", required=True, help="landing folder (date=YYYY-MM-DD/*.parquet)")
    r.add_argument(
        "--labels",
        metavar="LABELS",
        help="label feed: a landing folder date=YYYY-MM-DD/*.parquet (the arrival "
        "day) of stream, event_id, label, label_time (a landing folder only)",
    )
    r.add_argument(
        "--on-unknown-label",
        choices=("error", "quarantine"),
        default="error",
        help="a label of an unknown event: fail the night (default) or park it in "
        "quarantined_labels",
    )
    r.add_argument("--out", required=True,
                   help="output folder: a folder per table (by night), and state/")  # fmt: skip
    r.add_argument("--start", type=dt.date.fromisoformat, help="first day (default: the first)")
    r.add_argument("--end", type=dt.date.fromisoformat, help="last day (default: the last)")
    r.add_argument("--first-day", type=dt.date.fromisoformat,
                   help="the chain's first day (default: the landing's first day)")  # fmt: skip
    r.add_argument("--master", default="local[*]",
                   help="Spark master when not under spark-submit (default local[*])")  # fmt: skip
    r.add_argument("--table-format", choices=TABLE_FORMATS, default="parquet",
                   help="parquet (each night's partition folder overwritten) or delta "
                        "(replaceWhere; needs Delta Lake on the session)")  # fmt: skip
    r.add_argument("--n-buckets", type=int,
                   help="stream buckets, one engine call each (default: 4 per core)")  # fmt: skip
    add_method_options(r)
    r.set_defaults(func=_cmd_spark_run)
