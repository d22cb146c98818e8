"""``calpipe protect`` (a Parquet or CSV file of scored events through :func:`calpipe.protect`, with a
per-stream summary) and ``calpipe methods`` (every method's parameter table)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import polars as pl

import calpipe
from calpipe import config, metrics, storage
from calpipe.cli import progress
from calpipe.cli.options import add_method_options, method_params
from calpipe.errors import InputError, StoreError


def stream_summary(
    df: pl.DataFrame, *, base: str, protected: str, label: str, by: list[str], multiclass: bool
) -> pl.DataFrame:
    """Per-stream summary: events, labelled, base vs protected log loss / Brier / accuracy,
    final log10 martingale (the last row of each stream in replay order)."""
    mc = multiclass
    aggs = [
        pl.len().alias("events"),
        pl.col(label).is_not_null().sum().alias("labelled"),
        *metrics.base_vs_protected(base, protected, label, multiclass=mc),
        metrics.accuracy(base, label, multiclass=mc).alias("base_accuracy"),
        metrics.accuracy(protected, label, multiclass=mc).alias("protected_accuracy"),
        pl.col("log10_martingale").last().alias("final_log10_martingale"),
    ]
    if by:
        return df.group_by(by, maintain_order=True).agg(aggs).sort(by)
    return df.select(aggs)


def _cmd_protect(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if Path(args.output).is_dir():  # checked before the work, not after it (a traceback then)
        raise InputError(None, None, f"output {args.output} is a directory; name a Parquet file")
    show = progress.enabled(args.no_progress)
    with progress.status(f"reading {args.input}", show=show):
        events = _read(args.input)
    warm = "" if progress.kernels_cached() else " (compiling the kernels: first run only)"
    what = f"protecting {events.height:,} events with {args.method}{warm}"
    if show and events.height >= config.PROGRESS_MIN_EVENTS:  # seconds of work: a bar
        with progress.EventBar(what, total=events.height, show=show) as bar:
            out = _protect(events, args, progress=bar.advance)
    else:  # one kernel call, as without a terminal
        with progress.status(what, show=show):
            out = _protect(events, args)
    with progress.status(f"writing {args.output}", show=show):
        _write(out, args)
    return _summarise(events, out, args, t0)


def _read(path: str) -> pl.DataFrame:
    """The scored events of ``path``: a Parquet file, or a CSV one (``.csv``, ``.csv.gz``,
    ``.tsv``: a header row, read by DuckDB's sniffer as ``calpipe run`` reads it)."""
    if path.lower().endswith(storage.CSV_SUFFIXES):
        if not Path(path).is_file():
            raise InputError(None, None, f"cannot read {path}: no such file")
        try:
            return storage.EventSource.parse(path).read_file()
        except StoreError as exc:
            raise InputError(None, None, f"cannot read {path} as CSV: {exc}") from None
    try:
        return pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(None, None, f"cannot read {path} as Parquet: {exc}") from None


def _protect(events: pl.DataFrame, args: argparse.Namespace, progress=None) -> pl.DataFrame:
    """The protected rows of ``events``: :func:`calpipe.protect_with_state` (its rows, the
    same as :func:`calpipe.protect`'s), told ``progress(events)`` as the kernels go when given
    (a frame of ``config.PROGRESS_MIN_EVENTS`` or more then runs in pieces, the same bits)."""
    kw = dict(label=args.label, order_by=tuple(args.order_by), method=args.method)
    kw |= {"scores": args.scores} if args.scores else {"score": args.score}
    if args.by is not None:
        kw["by"] = tuple(args.by)
    if args.label_time:
        kw["label_time"] = args.label_time
    out = calpipe.protect_with_state(events, **kw, **method_params(args), progress=progress)
    out = out.scores
    if args.scores:
        out = out.with_columns(pl.col(args.scores).cast(pl.List(pl.Float64)))
        out = out.with_columns(pl.col("protected_scores").cast(pl.List(pl.Float64)))
    return out


def _write(out: pl.DataFrame, args: argparse.Namespace) -> None:
    tmp = Path(args.output).with_suffix(".parquet.tmp")
    try:
        out.write_parquet(tmp)
        tmp.replace(args.output)  # atomic: OUTPUT is either complete or untouched
    except BaseException:  # Ctrl-C or a full disk while writing: no partial file left either
        tmp.unlink(missing_ok=True)
        raise


def _summarise(events: pl.DataFrame, out: pl.DataFrame, args, t0: float) -> int:
    params = method_params(args)
    by = (
        list(args.by) if args.by is not None else (["stream"] if "stream" in events.columns else [])
    )
    multiclass = bool(args.scores)
    # Compare with the base as the engine saw it (clipped in log-loss mode), so that
    # base loss - protected loss is the log test martingale the last column reports.
    cal = calpipe.make_calibrator(args.method, **params)
    # a stack bets against its base method's forecasts, a method alone against the scores
    src = args.scores if multiclass else args.score
    stack_col = "base_method_scores" if multiclass else "base_method_score"
    src = stack_col if stack_col in out.columns else src
    raw = out[src].to_list() if multiclass else out[src].to_numpy()
    seen = cal.martingale_base(np.asarray(raw, dtype=np.float64))
    base = "base_as_seen"
    out_sum = out.with_columns(pl.Series(base, seen.tolist() if multiclass else seen))
    ordered = out_sum.sort([*by, *args.order_by])
    summary = stream_summary(
        ordered, base=base, protected="protected_scores" if multiclass else "protected_score",
        label=args.label, by=by, multiclass=multiclass,
    )  # fmt: skip
    with pl.Config(tbl_rows=50, tbl_cols=20, float_precision=4, tbl_width_chars=200):
        print(summary)
    print(f"wrote {out.height} rows to {args.output} in {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    table = calpipe.methods()
    if args.json:
        print(json.dumps(table, indent=2, default=str))
        return 0
    for name, spec in table.items():
        print(f"{name}\n  {spec['summary']}")
        for p, d in spec["parameters"].items():
            print(f"  --{p.replace('_', '-'):<16} default {d['default']!r}; {d['rule']}")
            print(f"  {'':<18} {d['help']}")
        print()
    return 0


def register(sub) -> None:
    """Add ``protect`` and ``methods`` to the ``calpipe`` sub-command parser."""
    p = sub.add_parser(
        "protect", help="protect the scores of a Parquet or CSV file of scored events"
    )
    p.add_argument("input", help="scored events (Parquet, or CSV: .csv, .csv.gz, .tsv)")
    p.add_argument("output", help="where to write the protected rows (Parquet)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--score", default="score", help="binary base probability column (default: score)"
    )
    src.add_argument("--scores", help="multiclass base probabilities (list column)")
    p.add_argument("--label", default="label")
    p.add_argument("--label-time", help="when each label became known (delayed feedback)")
    p.add_argument("--by", nargs="*", help="stream key columns (default: stream if present)")
    p.add_argument("--order-by", nargs="+", default=["event_time", "event_id"])
    add_method_options(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or status line (drawn only when standard error is a "
                        "terminal)")  # fmt: skip
    p.set_defaults(func=_cmd_protect)

    m = sub.add_parser("methods", help="list every method with its parameters and defaults")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_cmd_methods)
