"""The nightly job: the functions that the dagster assets and the ``calpipe`` CLI both call.

A day ``d`` flows through five stages, each one function that reads its inputs from the DuckDB
file and replaces its output partitions in one transaction (:mod:`calpipe.store`):

=====================  ===========================================  ================================
stage                  writes                                       reads
=====================  ===========================================  ================================
:func:`load_events`    ``scored_events``                            the event source
:func:`protect_days`   ``protected_scores``, ``calibrator_state``,  ``scored_events`` of d,
                       ``pipeline_days``                            the state of d - 1
:func:`monitor_days`   ``calibration_daily``                        protected scores, state
:func:`alarm_days`     ``martingale_alarms``                        protected scores (event times
                                                                    from scored events), state
:func:`map_days`       ``calibration_map``                          the state of d
=====================  ===========================================  ================================

Every stage takes a range of days ``[start, end]`` (a single dagster partition is a range of one
day; a backfill is a longer one). :func:`protect_days` runs the days in order, one
:func:`calpipe.protect_with_state` call per day over all streams, carrying the state in memory;
the stages that write event-sized tables hold one day at a time and commit whole days, as many
as fit in :data:`calpipe.config.TRANSACTION_ROWS` events (at most :data:`CHUNK_DAYS`); the other
stages are vectorized over chunks of :data:`CHUNK_DAYS` days. :func:`run_range` (the CLI's
``calpipe run``) writes the same rows as the five stages, each day once from memory, and
:func:`demo` is ``calpipe demo``.

The state of day d is keyed by d: re-running day d reads the state of d - 1 and replaces day d's
rows and state exactly. Running day d when d - 1 has no state (and d is not the chain's first
day) is a :class:`calpipe.errors.StateError`.

Example
-------
>>> import tempfile, calpipe.generate as gen, calpipe.store as store
>>> tmp = Path(tempfile.mkdtemp())
>>> events = gen.generate(n_days=3, seed=7)
>>> _ = store.write_landing(events, tmp / "landing")
>>> con = store.connect(tmp / "db.duckdb")
>>> summary = run_range(con, store.EventSource.parse(str(tmp / "landing")))
>>> summary.days, summary.events == events.height
(3, True)
>>> con.close()
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from calpipe import config, generate, metrics, store
from calpipe.calibrators import Calibrator, ProtectedCalibrator, make_calibrator
from calpipe.errors import CalpipeError, InputError, ParameterError, StateError
from calpipe.frame import (
    protect_with_state,
    replay_order,
    resolve_columns,
    state_from_rows,
    stream_ids,
    validate_frame,
)
from calpipe.store import EventSource

#: At most this many days per transaction when a stage runs over a range (fewer for big days,
#: see :func:`_write_days`); a single nightly partition is always one transaction.
CHUNK_DAYS = 31

#: Reliability diagrams in the materialization metadata pool the last 30 days: one day of a
#: small stream has too few events per bin to show anything.
RELIABILITY_WINDOW_DAYS = 30

#: Bins of the ECE and of the reliability tables: the issue's 10 equal-width bins on [0, 1].
ECE_BINS = 10

#: The bank demo: stream name, the base score column, and the shipped file (DESIGN §3 columns).
BANK_STREAM = "bank-telemarketing"
BANK_SCORE = "score_rf1000"
DATA_DIR = store.PROJECT_ROOT / "data"
BANK_FILE = DATA_DIR / "bank_marketing_scored.parquet"
GENERATED_FILE = DATA_DIR / "generated" / "synthetic_streams.parquet"

#: The demo's daily partitions: the bank stream's first and last contact dates (PROVENANCE:
#: 2008-06-09 .. 2010-11-17); the synthetic streams end on the same day.
DEMO_FIRST_DAY = dt.date(2008, 6, 9)
DEMO_LAST_DAY = dt.date(2010, 11, 17)

_BY = ("stream",)
_ORDER = ("event_time", "event_id")


# ----------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The calibrator a chain runs: a method name and its parameters (validated on use).

    The pipeline runs every method of :data:`calpipe.calibrators.METHODS` that takes a binary
    ``score`` (``composite-jumper`` default), and stacks (``base_method``/``base_params``); the
    Brier compatibility mode and multiclass scores are available in :func:`calpipe.protect` but
    not stored by the pipeline. The SQL serving map (``calibration_map``) exists for the
    protected methods; other methods serve through :func:`serving_map`.

    >>> Settings().fingerprint == Settings.from_json(Settings().to_json()).fingerprint
    True
    """

    method: str = "composite-jumper"
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(cls, method: str = "composite-jumper", **params) -> Settings:
        s = cls(method, tuple(sorted((k, _freeze(v)) for k, v in params.items())))
        s.calibrator()  # validate now
        return s

    @property
    def kwargs(self) -> dict[str, Any]:
        kw = dict(self.params)
        if kw.get("base_params") is not None:
            kw["base_params"] = dict(kw["base_params"])
        return kw

    def calibrator(self) -> Calibrator:
        cal = make_calibrator(self.method, **self.kwargs)
        cal.check_classes(2)
        if getattr(cal, "loss", "log") != "log":
            raise ParameterError(
                "the pipeline runs the log-loss methods (its serving map and SQL macros are the "
                "log-loss mixture); use calpipe.protect for loss='brier'"
            )
        return cal

    @property
    def fingerprint(self) -> str:
        return self.calibrator().fingerprint(2)

    def to_json(self) -> str:
        return json.dumps({"method": self.method, "params": self.kwargs}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        d = json.loads(text)
        return cls.make(d.get("method", "composite-jumper"), **d.get("params", {}))


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass
class StageResult:
    """What a stage wrote: the range, rows per table, and per-day notes for metadata."""

    start: dt.date
    end: dt.date
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def day_range(start: dt.date, end: dt.date) -> list[tuple[dt.date, dt.date]]:
    """[start, end] cut into consecutive chunks of at most :data:`CHUNK_DAYS` days."""
    if end < start:
        raise ValueError(f"empty range {start}..{end}")
    out, d = [], start
    while d <= end:
        e = min(end, d + dt.timedelta(days=CHUNK_DAYS - 1))
        out.append((d, e))
        d = e + dt.timedelta(days=1)
    return out


def _as_date(d: dt.date | str) -> dt.date:
    return d if isinstance(d, dt.date) else dt.date.fromisoformat(d)


_NO_DAY = pl.DataFrame()


def _write_days(
    con,
    start: dt.date,
    end: dt.date,
    tables: Sequence[str],
    read: Callable[[dt.date], pl.DataFrame],
    write: Callable[[store.PartitionWriter, dt.date, pl.DataFrame], None],
    *,
    background: bool = False,
    finish: Callable[[store.PartitionWriter, dt.date, dt.date], None] | None = None,
) -> dict[str, int]:
    """Replace the partitions of ``tables`` day by day over [start, end], in transactions of whole
    consecutive days; returns the rows written per table.

    Day d's input is ``read(d)`` and ``write(writer, d, input)`` writes its rows; ``finish`` is
    called at the end of each transaction with its days. A transaction starts at a day whose
    input is read first, and spans as many days as fit in :data:`calpipe.config.TRANSACTION_ROWS`
    rows at that day's size (at least one day, at most :data:`CHUNK_DAYS`): DuckDB keeps a
    transaction's new rows in memory until the commit, so a month of a big backfill in one
    transaction would hold a month, while small days still share a few commits. Every day's
    partitions of every table are replaced in one transaction (a crash leaves whole days)."""
    rows = dict.fromkeys(tables, 0)
    d = start
    while d <= end:
        data = read(d)
        span = config.TRANSACTION_ROWS // max(data.height, 1)
        e = min(end, d + dt.timedelta(days=min(max(span, 1), CHUNK_DAYS) - 1))
        with store.replacing_partitions(con, d, e, tables, background=background) as writer:
            for day in store.iter_days(d, e):
                if day != d:
                    writer.wait()  # the connection is free once the INSERTs sent so far are done
                    data = read(day)
                write(writer, day, data)
                data = _NO_DAY  # free the day before reading the next one
            if finish is not None:
                finish(writer, d, e)
        for table, n in writer.rows.items():
            rows[table] += n
        store.drop_block_cache(con)  # the days just committed are not read again
        d = e + dt.timedelta(days=1)
    return rows


# ----------------------------------------------------------------------------------------------
# Stage 1: scored events
# ----------------------------------------------------------------------------------------------
_EVENT_SCHEMA = {
    "event_date": pl.Date,
    "stream": pl.String,
    "event_id": pl.Int64,
    "event_time": pl.Datetime("us"),
    "score": pl.Float64,
    "label": pl.Int32,
}

#: The columns calpipe.protect reads, in both paths (stored events, or fresh from the source).
_PROTECT_INPUT = ("stream", "event_id", "event_time", "score", "label")


def _read_source(con, source: EventSource, start: dt.date, end: dt.date) -> pl.DataFrame:
    """The source's events of [start, end] in the data contract's names with ``event_date``,
    each checked to lie on its day, but not yet validated nor cast to the stored types."""
    raw = source.read_range(con, start, end)
    if raw.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    days = raw[store.DAY_COLUMN]
    norm = store.normalize_events(raw.drop(store.DAY_COLUMN), source.columns)
    del raw
    chunk = norm.with_columns(days.alias("event_date"))
    bad = chunk.filter(pl.col("event_time").cast(pl.Date) != pl.col("event_date"))
    if bad.height:
        r = bad.row(0, named=True)
        raise InputError(
            source.columns.event_time, None,
            f"{source.describe()}, day {r['event_date']}: event {r['event_id']} of stream "
            f"{r['stream']!r} has event_time {r['event_time']}, outside its day",
        )  # fmt: skip
    return chunk


def _source_error(exc: InputError, source: EventSource, chunk: pl.DataFrame) -> InputError:
    """``exc`` (raised on ``chunk``'s rows) restated with the source, day, stream and event."""
    if exc.row is None:
        return InputError(exc.column, None, f"{source.describe()}: {exc.rule}")
    r = chunk.row(exc.row, named=True)
    return InputError(
        exc.column, None,
        f"{source.describe()}, day {r['event_date']}, stream {r['stream']!r}, event "
        f"{r['event_id']}: {exc.rule}",
    )  # fmt: skip


def _stored_events(chunk: pl.DataFrame) -> pl.DataFrame:
    """``scored_events`` rows: the contract's columns cast to the stored types."""
    return chunk.select([pl.col(c).cast(t) for c, t in _EVENT_SCHEMA.items()])


def read_source_days(con, source: EventSource, start: dt.date, end: dt.date) -> pl.DataFrame:
    """Validated scored events of [start, end] from ``source`` (the rows ``load_events`` stores).

    Checks the data contract (DESIGN §3, via :func:`calpipe.frame.validate_frame` and
    :func:`calpipe.frame.replay_order`: scores in [0, 1], integer labels in {0, 1}, unique
    (stream, event_id), ...) and that each landing file's events fall on its folder's date.
    Raises :class:`calpipe.errors.InputError` naming the day, stream and event of the first
    offending row.
    """
    chunk = _read_source(con, source, start, end)
    if chunk.height:
        cols = resolve_columns(
            chunk.columns, score="score", scores=None, label="label", label_time=None,
            by=_BY, order_by=_ORDER,
        )  # fmt: skip
        try:
            validate_frame(chunk, cols, check_duplicates=False)
            # "(stream, event_id) unique" as calpipe.protect checks it: in an event log (time
            # order) strictly increasing ids prove it in one pass, where hashing every key
            # costs ~250 bytes a row
            replay_order(chunk, cols)
        except InputError as exc:
            raise _source_error(exc, source, chunk) from None
    return _stored_events(chunk)


def load_events(con, source: EventSource, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``scored_events``: validate the source's events of [start, end] and store them.

    A bad event fails the stage with a clear message and writes nothing for its chunk; a day
    without events stores an empty partition (and is still a day of the chain). The result's
    ``notes`` lists the days without events (a late landing shows up there).

    Days are read, validated and written one at a time, in transactions of whole days
    (:func:`_write_days`): memory is bounded by a day. Rows are stored in the source's order,
    which is deterministic (re-running a day from the same files writes identical rows).
    """
    start, end = _as_date(start), _as_date(end)
    res = StageResult(start, end)

    def write(writer: store.PartitionWriter, d: dt.date, rows: pl.DataFrame) -> None:
        if rows.height == 0:
            res.notes.append(d.isoformat())
        writer.insert("scored_events", rows, sort=False)

    res.rows = _write_days(
        con, start, end, ["scored_events"], lambda d: read_source_days(con, source, d, d), write
    )
    return res


# ----------------------------------------------------------------------------------------------
# Stage 2: protected scores and calibrator state (the chain)
# ----------------------------------------------------------------------------------------------
def chain_first_day(con) -> dt.date | None:
    """The first day of the chain stored in this database (None before the first run)."""
    row = store.fetch_one(con, "SELECT min(first_day) FROM pipeline_days")
    return None if row is None else row[0]


def _first_missing_day(con, first_day: dt.date, before: dt.date) -> dt.date | None:
    done = {
        r[0]
        for r in con.execute(
            "SELECT date FROM pipeline_days WHERE date BETWEEN ? AND ?", [first_day, before]
        ).fetchall()
    }
    for d in store.iter_days(first_day, before):
        if d not in done:
            return d
    return None


def state_before(con, day: dt.date, settings: Settings, first_day: dt.date) -> pl.DataFrame | None:
    """The calibrator state at the end of ``day - 1`` (None when ``day`` is the first day).

    Raises StateError with what to do if ``day - 1`` has not been materialized, was computed under
    another configuration, or belongs to a chain that starts on another day.
    """
    if day < first_day:
        raise StateError(f"day {day} is before the chain's first day {first_day}")
    if day == first_day:
        recorded = chain_first_day(con)
        if recorded is not None and recorded != first_day:
            raise StateError(
                f"cannot start a chain on {day}: this database's chain starts on {recorded} "
                "(set the first day to it, e.g. CALPIPE_START_DATE, or use a new database)"
            )
        return None
    prev = day - dt.timedelta(days=1)
    row = store.fetch_one(
        con,
        "SELECT first_day, method, config_fingerprint, config_json FROM pipeline_days WHERE date = ?",
        [prev],
    )
    if row is None:
        missing = _first_missing_day(con, first_day, prev)
        raise StateError(
            f"cannot run day {day}: day {prev} has no calibrator state. The chain starts on "
            f"{first_day}; materialize the days in order (first missing day: {missing}), or run a "
            f"backfill from {missing} to {day}"
        )
    rec_first, method, fp, cfg = row
    if rec_first != first_day:
        raise StateError(
            f"cannot run day {day}: this database's chain starts on {rec_first}, but this run "
            f"says the first day is {first_day}"
        )
    if fp != settings.fingerprint:
        raise StateError(
            f"cannot run day {day}: day {prev} was computed by {method!r} with config "
            f"fingerprint {fp} ({cfg}), this run is {settings.method!r} with fingerprint "
            f"{settings.fingerprint} ({settings.to_json()}); loading a state under another "
            "configuration is an error: use the same method options, or a new database"
        )
    state = store.query(
        con, "SELECT * FROM calibrator_state WHERE date = ? ORDER BY stream", [prev]
    )
    return state.drop("date")


def _martingale_base(cal: Calibrator, scores: pl.DataFrame) -> pl.Series:
    """``base_score``: the forecast the martingale bets against (the clipped base, or a stack's
    base-method forecast), so that base loss - protected loss = ln 10 * log10 S."""
    if "base_method_score" in scores.columns:
        return scores["base_method_score"].alias("base_score")
    return pl.Series("base_score", cal.martingale_base(scores["score"].to_numpy()))


#: A day's scored events in their stored order (the source's: deterministic, so the day's
#: protected_scores rows, written in the same order, are too). No ORDER BY: calpipe.protect
#: groups the streams by hashing and finds an event log already in time order without a sort,
#: where a SQL sort by (stream, event_time, event_id) would cost more than the protection.
_DAY_EVENTS_SQL = f"SELECT {', '.join(_PROTECT_INPUT)} FROM scored_events WHERE event_date = ?"

#: Interval outputs of the Venn methods, stored when the method produces them.
_INTERVAL_COLUMNS = ("p_lower", "p_upper")


def _protected_rows(cal: Calibrator, scores: pl.DataFrame, day: dt.date) -> pl.DataFrame:
    """The ``protected_scores`` rows of one day: the event key and the engine's outputs only
    (``v_protected_scores`` joins the inputs, method and fingerprint back)."""
    return scores.select(
        pl.lit(day, pl.Date).alias("event_date"),
        "stream",
        "event_id",
        _martingale_base(cal, scores),
        pl.col("label").cast(pl.Int32),
        "protected_score",
        "log10_martingale",
        *[c for c in _INTERVAL_COLUMNS if c in scores.columns],
    )


@dataclass
class _Day:
    """One day of a chain: the engine's output (input columns + outputs, in the input's row
    order), its ``protected_scores`` rows, the state rows at the end of the day, the
    ``pipeline_days`` row, and the state before the day (None on the chain's first day)."""

    scores: pl.DataFrame
    protected: pl.DataFrame
    state: pl.DataFrame
    day_row: dict[str, Any]
    before: pl.DataFrame | None


class _Chain:
    """A chain run day after day: the settings, and the state carried in memory (one small row
    per stream) from one day to the next."""

    def __init__(self, settings: Settings, first_day: dt.date, state: pl.DataFrame | None):
        self.settings, self.first_day, self.state = settings, first_day, state
        self.cal = settings.calibrator()
        self.fp = self.cal.fingerprint(2)
        self.cfg = settings.to_json()

    def protect(self, events: pl.DataFrame, state: pl.DataFrame | None):
        """One :func:`calpipe.protect_with_state` call over the streams of ``events`` (columns
        :data:`_PROTECT_INPUT`) from ``state``. Raises InputError for events that break the data
        contract (validated there)."""
        return protect_with_state(
            events, score="score", label="label", by=_BY, order_by=_ORDER,
            method=self.settings.method, state=state, **self.settings.kwargs,
        )  # fmt: skip

    def day_row(self, day: dt.date, n_events: int, n_active: int) -> dict[str, Any]:
        """The ``pipeline_days`` row of ``day`` (call after the day: the state is the day's)."""
        return {
            "date": day, "first_day": self.first_day, "method": self.cal.name,
            "config_fingerprint": self.fp, "config_json": self.cfg, "n_events": n_events,
            "n_streams": 0 if self.state is None else self.state.height,
            "n_active_streams": n_active,
        }  # fmt: skip

    def step(self, events: pl.DataFrame, day: dt.date) -> _Day:
        """Run ``day``'s events (columns :data:`_PROTECT_INPUT`) from the carried state: one
        :meth:`protect` call over all streams."""
        r = self.protect(events, self.state)
        before, self.state = self.state, r.state
        return _Day(
            r.scores,
            _protected_rows(self.cal, r.scores, day),
            r.state.with_columns(pl.lit(day, pl.Date).alias("date")),
            self.day_row(day, events.height, events["stream"].n_unique()),
            before,
        )


def protect_days(
    con,
    start: dt.date,
    end: dt.date,
    settings: Settings,
    *,
    first_day: dt.date | None = None,
    on_day: Callable[[dt.date], None] | None = None,
) -> StageResult:
    """Stage ``protected_scores`` + ``calibrator_state``: run the days [start, end] in order.

    Day d starts from the state of d - 1 (read from the database for the first day of the range,
    then carried in memory), runs one :func:`calpipe.protect_with_state` over all streams of the
    day, and produces the day's protected rows, its state rows (keyed by d, one per stream seen
    so far) and its ``pipeline_days`` row. Days are read and written one at a time, in
    transactions of whole days (:func:`_write_days`): only one day's events and the small state
    frame are held in memory. ``first_day`` is the chain's first day (default: the one stored,
    else ``start``).
    """
    start, end = _as_date(start), _as_date(end)
    if first_day is None:
        first_day = chain_first_day(con) or start
    first_day = _as_date(first_day)
    chain = _Chain(settings, first_day, state_before(con, start, settings, first_day))

    def write(writer: store.PartitionWriter, d: dt.date, events: pl.DataFrame) -> None:
        day = chain.step(events, d)
        # in the input's order (the engine keeps it): no sort of the day's rows
        writer.insert("protected_scores", day.protected, sort=False)
        writer.insert("calibrator_state", day.state)
        writer.insert("pipeline_days", pl.DataFrame([day.day_row]))
        if on_day is not None:
            on_day(d)

    tables = ["protected_scores", "calibrator_state", "pipeline_days"]
    rows = _write_days(
        con, start, end, tables, lambda d: store.query(con, _DAY_EVENTS_SQL, [d]), write
    )
    return StageResult(start, end, {t: rows[t] for t in tables[:2]})


def _require_chain(con, start: dt.date, end: dt.date, what: str) -> None:
    missing = _first_missing_day(con, start, end)
    if missing is not None:
        raise StateError(
            f"cannot compute {what} for {missing}: protected_scores/calibrator_state of {missing} "
            "have not been materialized"
        )


# ----------------------------------------------------------------------------------------------
# Stage 3: monitoring
# ----------------------------------------------------------------------------------------------
def _group_ids(frame: pl.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, first): a dense group id per row for its ``keys`` and the first row of each group.

    A single string key without nulls (the stream) goes through polars' categorical codes: one
    hash lookup per row, several times cheaper than :func:`calpipe.frame.stream_ids`' collision
    check on ten million strings; other keys use :func:`calpipe.frame.stream_ids`. The ids'
    order is arbitrary (callers sort by the keys)."""
    key = frame[keys[0]] if len(keys) == 1 else None
    if key is None or key.dtype != pl.String or key.null_count():
        return stream_ids(frame, keys)
    codes = key.cast(pl.Categorical).to_physical().to_numpy()
    n = codes.shape[0]
    first = np.full(int(codes.max()) + 1 if n else 0, n, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(n, dtype=np.int64))
    present = first < n
    dense = np.cumsum(present, dtype=np.int64) - 1
    return dense[codes], first[present]


def daily_metrics(
    scores: pl.DataFrame,
    keys: Sequence[str] = ("event_date", "stream"),
    *,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> pl.DataFrame:
    """Forecast quality of base vs protected per group (``keys``) of protected rows.

    Counts, mean natural log loss, Brier and ECE (:data:`ECE_BINS` equal-width bins) over the
    labelled events, mean base / protected score over all events, mean label over labelled
    ones, and the within-group maximum of the running log10 martingale. The base is
    ``base_score``, the score as the engine used it (clipped in log-loss mode), so that base
    minus protected cumulative log loss is the log test martingale.

    The definitions are those of :mod:`calpipe.metrics` (log loss of p(y) clipped below at
    :data:`calpipe.metrics.LOG_LOSS_FLOOR`; ECE = sum_b (n_b / n) |mean p in b - mean y in b|),
    evaluated for all groups at once as per-group sums (``np.bincount`` over a dense group id):
    a monitoring day is millions of rows in a thousand streams, where polars' per-group
    expressions cost several times more time and memory. The sums run in row order, so the
    same rows in the same order give the same bits. Groups without labelled events get nulls.
    ``groups`` is ``_group_ids(scores, keys)`` if the caller has it already.

    >>> s = pl.DataFrame({"stream": ["a", "a", "b"], "base_score": [0.2, 0.7, 0.5],
    ...                   "protected_score": [0.3, 0.6, 0.5], "label": [0, 1, None],
    ...                   "log10_martingale": [0.01, 0.05, 0.0]})
    >>> m = daily_metrics(s, keys=["stream"])
    >>> m.select("stream", "n_events", "n_labelled", pl.col("base_brier").round(3)).rows()
    [('a', 2, 2, 0.065), ('b', 1, 0, None)]
    """
    keys = list(keys)
    ids, first = _group_ids(scores, keys) if groups is None else groups
    n_groups = first.shape[0]
    base = scores["base_score"].cast(pl.Float64).to_numpy()
    prot = scores["protected_score"].cast(pl.Float64).to_numpy()
    y_all = scores["label"].cast(pl.Float64).to_numpy()  # null -> NaN
    labelled = ~np.isnan(y_all)
    # the labelled events, once: every loss and the ECE are means over them
    ids_l = ids[labelled]
    y = y_all[labelled]
    del y_all
    n = np.bincount(ids, minlength=n_groups)
    n_lab = np.bincount(ids_l, minlength=n_groups)

    def labelled_sum(v: np.ndarray, idx: np.ndarray = ids_l, size: int = n_groups) -> np.ndarray:
        return np.bincount(idx, weights=v, minlength=size)

    def log_loss(f: np.ndarray) -> np.ndarray:  # metrics.log_loss: -ln p(y), p(y) >= floor
        q = np.where(y == 1.0, f, 1.0 - f)
        return labelled_sum(-np.log(np.clip(q, metrics.LOG_LOSS_FLOOR, 1.0, out=q)))

    def ece_sum(f: np.ndarray) -> np.ndarray:  # metrics.ece times n: per (group, bin), then group
        # a NaN forecast (an invalid protected_scores row) goes to bin 0 and makes its group's
        # ECE NaN, instead of an invalid bin index
        b = np.clip(np.nan_to_num(f) * ECE_BINS, 0, ECE_BINS - 1).astype(np.int64)
        idx = ids_l * ECE_BINS + b
        size = n_groups * ECE_BINS
        # n_b |mean f - mean y| over the bin's labelled events = |sum f - sum y|
        gap = np.abs(labelled_sum(f, idx, size) - labelled_sum(y, idx, size))
        return gap.reshape(n_groups, ECE_BINS).sum(axis=1)

    base_l, prot_l = base[labelled], prot[labelled]
    peak = np.full(n_groups, -np.inf)
    np.maximum.at(peak, ids, scores["log10_martingale"].cast(pl.Float64).to_numpy())
    with np.errstate(invalid="ignore", divide="ignore"):
        values = {
            "n_events": n.astype(np.int64),
            "n_labelled": n_lab.astype(np.int64),
            "base_log_loss": log_loss(base_l) / n_lab,
            "protected_log_loss": log_loss(prot_l) / n_lab,
            "base_brier": labelled_sum((base_l - y) ** 2) / n_lab,
            "protected_brier": labelled_sum((prot_l - y) ** 2) / n_lab,
            "base_ece": ece_sum(base_l) / n_lab,
            "protected_ece": ece_sum(prot_l) / n_lab,
            "mean_score": np.bincount(ids, weights=base, minlength=n_groups) / n,
            "mean_protected": np.bincount(ids, weights=prot, minlength=n_groups) / n,
            "mean_label": labelled_sum(y) / n_lab,
            "log10_martingale_max": peak,
        }
    # no labelled event: 0 / 0 -> null, as the polars means of an empty selection
    over_labelled = [
        c for c in values if c.endswith(("_log_loss", "_brier", "_ece")) or c == "mean_label"
    ]
    out = pl.DataFrame(values).with_columns(
        pl.when(pl.col("n_labelled") > 0).then(pl.col(c)).alias(c) for c in over_labelled
    )
    groups = scores.select(keys)[first.tolist()]
    return pl.concat([groups, out], how="horizontal").sort(keys)


#: One day's protected rows, the columns the monitoring reads, in their stored order (the
#: order the engine wrote them: the sums of the metrics run in it, so both paths agree to the bit).
_DAY_SCORES_SQL = (
    "SELECT stream, base_score, protected_score, label, log10_martingale FROM protected_scores "
    "WHERE event_date = ?"
)


def _daily_rows(
    scores: pl.DataFrame,
    state: pl.DataFrame,
    day: dt.date,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> pl.DataFrame:
    """``calibration_daily`` rows of ``day``: :func:`daily_metrics` of the day's protected rows
    (``scores``) per stream, with the end-of-day martingale and its maximum to date from the
    day's ``state`` rows, and the alarm flag. ``groups``: ``_group_ids(scores, ["stream"])``."""
    thr = config.ALARM_LOG10_THRESHOLD
    end_of_day = state.select(
        "stream",
        "log10_martingale",
        pl.col("log10_martingale_max").alias("log10_martingale_max_to_date"),
    )
    return (
        daily_metrics(scores, keys=("stream",), groups=groups)
        .select(pl.lit(day, pl.Date).alias("date"), pl.all())
        .join(end_of_day, on="stream", how="left")
        .with_columns((pl.col("log10_martingale_max") >= thr).alias("alarm"))
    )


def monitor_days(con, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``calibration_daily``: one row per stream with events per day of [start, end].

    One transaction per chunk of :data:`CHUNK_DAYS` days, computed one day at a time."""
    start, end = _as_date(start), _as_date(end)
    _require_chain(con, start, end, "calibration_daily")
    res = StageResult(start, end, {"calibration_daily": 0})
    for c0, c1 in day_range(start, end):
        state = store.read_partitions(
            con, "calibrator_state", c0, c1,
            columns=["date", "stream", "log10_martingale", "log10_martingale_max"],
        )  # fmt: skip
        with store.replacing_partitions(con, c0, c1, ["calibration_daily"]) as writer:
            for d in store.iter_days(c0, c1):
                scores = store.query(con, _DAY_SCORES_SQL, [d])
                state_d = state.filter(pl.col("date") == d)
                writer.insert("calibration_daily", _daily_rows(scores, state_d, d))
                del scores
        res.rows["calibration_daily"] += writer.rows["calibration_daily"]
    return res


# ----------------------------------------------------------------------------------------------
# Stage 4: alarms
# ----------------------------------------------------------------------------------------------
#: First crossing of the threshold per stream in [$1, $2], for the streams whose running maximum
#: before $1 (the state of $1 - 1) is below it ($3 = threshold): among the protected rows at or
#: above the threshold, the first in replay order (event_time from scored_events, event_id).
#: (event_time, event_id) is unique within a stream, so arg_min picks one row: no sort.
_ALARM_SQL = """
WITH hot AS (
    SELECT stream FROM calibrator_state
    WHERE date = $1 - INTERVAL 1 DAY AND log10_martingale_max >= $3),
hits AS (
    SELECT p.event_date, p.stream, e.event_time, p.event_id, p.log10_martingale
    FROM protected_scores p
    JOIN scored_events e
      ON e.event_date = p.event_date AND e.stream = p.stream AND e.event_id = p.event_id
     AND e.event_date BETWEEN $1 AND $2
    WHERE p.event_date BETWEEN $1 AND $2 AND p.log10_martingale >= $3
      AND p.stream NOT IN (SELECT stream FROM hot)),
firsts AS (SELECT arg_min(h, (h.event_time, h.event_id)) AS f FROM hits h GROUP BY h.stream)
SELECT f.event_date AS date, f.stream, f.event_time, f.event_id, f.log10_martingale,
       CAST($3 AS DOUBLE) AS threshold
FROM firsts ORDER BY f.stream
"""


def _first_crossings(
    scores: pl.DataFrame,
    before: pl.DataFrame | None,
    day: dt.date,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> pl.DataFrame:
    """``martingale_alarms`` rows of ``day`` from the engine's output in memory (what
    :data:`_ALARM_SQL` finds in the tables): per stream whose maximum before the day (``before``,
    the state of day - 1) is below the threshold, its first event in replay order with
    log10 S >= threshold. Per-stream minima of event_time, then of event_id among the ties,
    instead of a sort. ``groups``: ``_group_ids(scores, ["stream"])`` if known."""
    thr = config.ALARM_LOG10_THRESHOLD
    hit = scores["log10_martingale"].to_numpy() >= thr
    if before is not None and before.height:
        hot = before.filter(pl.col("log10_martingale_max") >= thr)["stream"]
        hit &= ~scores["stream"].is_in(hot.implode()).to_numpy()
    hits = np.flatnonzero(hit)
    if hits.size:
        ids, first = _group_ids(scores, ["stream"]) if groups is None else groups
        t = scores["event_time"].to_physical().to_numpy()
        t_first = np.full(first.shape[0], np.iinfo(np.int64).max)
        np.minimum.at(t_first, ids[hits], t[hits])
        hits = hits[t[hits] == t_first[ids[hits]]]  # the hits at their stream's first time
    first_rows = scores[hits.tolist()].sort("stream", "event_id").unique("stream", keep="first")
    return first_rows.sort("stream").select(
        pl.lit(day, pl.Date).alias("date"),
        "stream",
        "event_time",
        "event_id",
        "log10_martingale",
        pl.lit(thr, pl.Float64).alias("threshold"),
    )


def alarm_days(con, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``martingale_alarms``: the first crossing of log10 S >= 2 per stream, in its day.

    A stream crosses on day d if its running maximum before d (the state of d - 1) is below the
    threshold and one of its events of day d reaches it; the row records that event and value.
    """
    start, end = _as_date(start), _as_date(end)
    _require_chain(con, start, end, "martingale_alarms")
    thr = config.ALARM_LOG10_THRESHOLD
    res = StageResult(start, end, {"martingale_alarms": 0})
    for c0, c1 in day_range(start, end):
        alarms = store.query(con, _ALARM_SQL, [c0, c1, thr])
        store.replace_partitions(con, c0, c1, {"martingale_alarms": alarms})
        res.rows["martingale_alarms"] += alarms.height
    return res


# ----------------------------------------------------------------------------------------------
# Stage 5: the serving map
# ----------------------------------------------------------------------------------------------
def map_weights(state: pl.DataFrame, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
    """The serving map's weights of each state row: ``(P (n,), W (n, T))``.

    The map is p' = P p + sum_theta W_theta f_theta(p) on the clipped p, where W_theta =
    sum_J of the jump-mixed active weights (1 - J) A^J_theta + J / |Theta| sum_theta' A^J_theta'
    (DESIGN §4: the mixture after the next jump-mixing step).
    """
    cal = settings.calibrator()
    st = state_from_rows(cal, state, 2)
    rates = cal.rates[None, :, None]
    n_fun = st.active.shape[2]
    mixed = (1.0 - rates) * st.active + st.active.sum(axis=2, keepdims=True) * rates / n_fun
    return st.passive, mixed.sum(axis=1)


#: Term family names in ``calibration_map`` (and the SQL macro ``calpipe_term``).
_TERM_FAMILY = {"quadratic": "quadratic", "cubic": "cubic", "cox": "cox", "cox2": "cox"}


def map_terms(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows (columns ``date``/``stream`` kept): one passive term
    (``identity``, weight P) and one term per calibrating function (weight W_theta)."""
    cal = settings.calibrator()
    fam = cal.family(2)
    passive, w = map_weights(state, settings)
    n, t = w.shape[0], fam.size
    fam_name = _TERM_FAMILY[fam.name]
    terms = pl.DataFrame(
        {
            "term": pl.Series(np.tile(np.arange(t + 1), n), dtype=pl.Int32),
            "family": np.tile(np.array(["identity"] + [fam_name] * t), n),
            "a": np.tile(np.concatenate([[0.0], fam.params[:, 0]]), n),
            "b": np.tile(np.concatenate([[0.0], fam.params[:, 1]]), n),
            "weight": np.column_stack([passive, w]).ravel(),
        }
    )
    keys = state.select("date", "stream").select(pl.all().repeat_by(t + 1).explode())
    return pl.concat([keys, terms], how="horizontal").with_columns(
        pl.lit(float(cal.params["clip"])).alias("clip"),
        pl.lit(cal.name).alias("method"),
        pl.lit(cal.fingerprint(2)).alias("config_fingerprint"),
    )


def _map_rows(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows: :func:`map_terms` for the protected methods; none
    for the others (no SQL form of a fitted isotonic/Venn/... map: serve with serving_map())."""
    if isinstance(settings.calibrator(), ProtectedCalibrator):
        return map_terms(state, settings)
    return pl.DataFrame(schema={"date": pl.Date, "stream": pl.String, "term": pl.Int32})


def map_days(con, start: dt.date, end: dt.date, settings: Settings) -> StageResult:
    """Stage ``calibration_map``: the serving map of every stream at the end of each day.

    The map's SQL form (terms of the mixture, ``calpipe_protect`` macro) exists for the protected
    methods; for the other methods the partitions are left empty (use :func:`serving_map`)."""
    start, end = _as_date(start), _as_date(end)
    _require_chain(con, start, end, "calibration_map")
    fp = settings.fingerprint
    res = StageResult(start, end, {"calibration_map": 0})
    for c0, c1 in day_range(start, end):
        state = store.read_partitions(con, "calibrator_state", c0, c1)
        other = state.filter(pl.col("config_fingerprint") != fp)
        if other.height:
            r = other.row(0, named=True)
            raise StateError(
                f"calibrator_state of {r['date']} was written with config fingerprint "
                f"{r['config_fingerprint']}, the map is asked for {fp}"
            )
        terms = _map_rows(state, settings)
        store.replace_partitions(con, c0, c1, {"calibration_map": terms})
        res.rows["calibration_map"] += terms.height
    return res


def serving_map(
    state: pl.DataFrame,
    scores: pl.DataFrame,
    settings: Settings | None = None,
    *,
    score: str = "score",
    stream: str = "stream",
) -> pl.DataFrame:
    """Apply each stream's serving map (its state's next forecast, DESIGN §4) to fresh scores.

    ``state`` is a state frame (one row per stream, from :func:`calpipe.protect_with_state` or the
    ``calibrator_state`` table); ``scores`` has the stream column and a ``score`` column (binary:
    Float64; K classes: a list of K floats). Returns ``scores`` with ``protected_score`` (or
    ``protected_scores``), null for streams without state. Uses the calibrator's own
    :meth:`~calpipe.calibrators.protected.ProtectedCalibrator.serving_map` (the kernel), one
    vectorized call for all rows.

    >>> import calpipe, polars as pl
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 1]})
    >>> st = calpipe.protect_with_state(ev).state
    >>> out = serving_map(st, pl.DataFrame({"stream": ["a", "b"], "score": [0.5, 0.5]}))
    >>> round(out["protected_score"][0], 4), out["protected_score"][1]
    (0.5005, None)
    """
    settings = settings or Settings()
    cal = settings.calibrator()
    multiclass = isinstance(scores.schema[score], pl.List | pl.Array)
    out_name = "protected_scores" if multiclass else "protected_score"
    joined = scores.with_row_index("__row").join(
        state.select(stream, "method", "weights", "log10_martingale", "config_fingerprint"),
        on=stream, how="left", maintain_order="left",
    )  # fmt: skip
    has = joined["weights"].is_not_null().to_numpy()
    k = 2
    if multiclass:
        k = (
            int(joined[score].list.len().max())
            if isinstance(scores.schema[score], pl.List)
            else scores.schema[score].size
        )
    fp = cal.fingerprint(k)
    bad = joined.filter(
        pl.col("config_fingerprint").is_not_null() & (pl.col("config_fingerprint") != fp)
    )
    if bad.height:
        cal.check_state(bad["config_fingerprint"][0], bad["method"][0], k)
    sub = joined.filter(pl.Series(has))
    n = sub.height
    result = np.full((joined.height, k) if multiclass else joined.height, np.nan)
    if n:
        bstate = state_from_rows(cal, sub, k)
        if multiclass:
            col_in = sub[score]
            arr = col_in.list.to_array(k) if isinstance(col_in.dtype, pl.List) else col_in
            x = arr.cast(pl.Array(pl.Float64, k)).to_numpy().reshape(n, 1, k)
        else:
            x = sub[score].cast(pl.Float64).to_numpy()[:, None]
        mapped = cal.serving_map(bstate, np.ascontiguousarray(x))
        result[has] = mapped[:, 0]
    if multiclass:
        col = pl.Series(out_name, result).cast(pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64))
        col = pl.select(pl.when(pl.Series(has)).then(col)).to_series().alias(out_name)
    else:
        col = pl.Series(out_name, result).fill_nan(None)
    return scores.with_columns(col)


# ----------------------------------------------------------------------------------------------
# Checks (the asset checks, and what `calpipe run` verifies)
# ----------------------------------------------------------------------------------------------
@dataclass
class CheckOutcome:
    """Result of a data check: ``passed``, a one-line ``description``, a small ``details`` frame."""

    name: str
    passed: bool
    description: str
    details: pl.DataFrame | None = None
    warning: bool = False  # severity: a failed warning check does not fail the job


def check_probabilities(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Protected scores are finite probabilities in [0, 1] and the martingale is finite."""
    bad = store.query(
        con,
        """WITH bad AS (
               SELECT event_date, stream, event_id, protected_score, log10_martingale
               FROM protected_scores
               WHERE event_date BETWEEN $1 AND $2
                 AND (protected_score IS NULL OR isnan(protected_score) OR protected_score < 0
                      OR protected_score > 1 OR NOT isfinite(log10_martingale)))
           SELECT b.* FROM bad b
           LEFT JOIN scored_events e
                  ON e.event_date = b.event_date AND e.stream = b.stream
                 AND e.event_id = b.event_id AND e.event_date BETWEEN $1 AND $2
           ORDER BY b.event_date, b.stream, e.event_time, b.event_id LIMIT 10""",
        [start, end],
    )
    ok = bad.height == 0
    return CheckOutcome(
        "probabilities_valid", ok,
        "every protected score is a probability in [0, 1]" if ok
        else f"{bad.height}+ invalid protected scores (first: {bad.row(0)})",
        bad,
    )  # fmt: skip


def check_row_counts(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Each day has as many protected rows as scored events (per stream)."""
    diff = store.query(
        con,
        """WITH i AS (SELECT event_date, stream, count(*) AS n_in FROM scored_events
                      WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL),
                o AS (SELECT event_date, stream, count(*) AS n_out FROM protected_scores
                      WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL)
           SELECT event_date, stream, coalesce(n_in, 0) AS n_in, coalesce(n_out, 0) AS n_out
           FROM i FULL OUTER JOIN o USING (event_date, stream)
           WHERE coalesce(n_in, 0) <> coalesce(n_out, 0)
           ORDER BY event_date, stream""",
        [start, end],
    )
    ok = diff.height == 0
    return CheckOutcome(
        "rows_in_equal_rows_out", ok,
        "rows in = rows out for every day and stream" if ok
        else f"{diff.height} (day, stream) with rows in != rows out, first {diff.row(0)}",
        diff,
    )  # fmt: skip


def check_state_continuity(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """No gap in the chain: every day of the range (and the day before it, unless the range starts
    the chain) has state, one configuration throughout, and each stream's event count grows by
    exactly the day's events."""
    problems: list[str] = []
    days = store.query(
        con,
        "SELECT date, first_day, config_fingerprint FROM pipeline_days "
        "WHERE date BETWEEN ? AND ? ORDER BY date",
        [start - dt.timedelta(days=1), end],
    )
    have = set(days["date"].to_list())
    first = days["first_day"].min() if days.height else None
    lo = start if first is None or start <= first else start - dt.timedelta(days=1)
    missing = [d for d in store.iter_days(lo, end) if d not in have]
    if missing:
        shown = ", ".join(d.isoformat() for d in missing[:5])
        problems.append(f"days without state: {shown}{' ...' if len(missing) > 5 else ''}")
    if days["config_fingerprint"].n_unique() > 1:
        problems.append(f"several configurations: {days['config_fingerprint'].unique().to_list()}")
    jumps = store.query(
        con,
        """WITH s AS (
               SELECT date, stream, n_events,
                      lag(n_events) OVER (PARTITION BY stream ORDER BY date) AS prev_events,
                      lag(date) OVER (PARTITION BY stream ORDER BY date) AS prev_date
               FROM calibrator_state WHERE date BETWEEN $1 - INTERVAL 1 DAY AND $2),
           e AS (SELECT event_date AS date, stream, count(*) AS n_day FROM scored_events
                 WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL)
           SELECT s.date, s.stream, s.prev_events, coalesce(e.n_day, 0) AS n_day, s.n_events
           FROM s LEFT JOIN e USING (date, stream)
           WHERE s.date >= $1 AND s.prev_date IS NOT NULL
             AND (s.prev_date <> s.date - INTERVAL 1 DAY
                  OR s.n_events <> s.prev_events + coalesce(e.n_day, 0))
           ORDER BY s.date, s.stream LIMIT 10""",
        [start, end],
    )
    if jumps.height:
        r = jumps.row(0, named=True)
        problems.append(
            f"state counts do not follow the events: stream {r['stream']!r} on {r['date']} has "
            f"n_events {r['n_events']}, expected {r['prev_events']} + {r['n_day']} events of the day"
        )
    ok = not problems
    return CheckOutcome(
        "state_continuity", ok,
        f"the chain has no gap from {lo} to {end}" if ok else "; ".join(problems),
        jumps if jumps.height else None,
    )  # fmt: skip


def check_alarms(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Warning: streams whose test martingale has reached 100 (log10 S >= 2) by the end of
    ``end``: their base forecasts are rejected as miscalibrated at the 1 % level (Ville)."""
    hot = store.query(
        con,
        """SELECT s.stream, s.log10_martingale, s.log10_martingale_max, a.date AS alarm_date
           FROM calibrator_state s LEFT JOIN martingale_alarms a USING (stream)
           WHERE s.date = ? AND s.log10_martingale_max >= ?
           ORDER BY s.stream""",
        [end, config.ALARM_LOG10_THRESHOLD],
    )
    ok = hot.height == 0
    return CheckOutcome(
        "no_martingale_alarm", ok,
        "no stream has reached log10 S >= 2" if ok
        else f"{hot.height} stream(s) at alarm level (S >= 100): {', '.join(hot['stream'].to_list())}",
        hot, warning=True,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Reports (materialization metadata, the demo summary)
# ----------------------------------------------------------------------------------------------
def markdown_table(df: pl.DataFrame, *, float_digits: int = 4) -> str:
    """A frame as a GitHub-markdown table (floats rounded), for dagster metadata and the README."""
    if df.width == 0:
        return "(empty)"

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.{float_digits}f}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * df.width]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines)


def day_report(con, start: dt.date, end: dt.date) -> pl.DataFrame:
    """Per stream over [start, end]: events, base vs protected log loss / Brier / ECE, end and
    max log10 martingale, alarm (the markdown table of a materialization)."""
    scores = store.read_partitions(
        con, "protected_scores", start, end,
        columns=["stream", "base_score", "protected_score", "label", "log10_martingale"],
    )  # fmt: skip
    stats = daily_metrics(scores, keys=("stream",))
    last = store.query(
        con,
        "SELECT stream, log10_martingale AS log10_S_end FROM calibrator_state WHERE date = ?",
        [end],
    )
    return stats.join(last, on="stream", how="left").select(
        "stream",
        "n_events",
        "base_log_loss",
        "protected_log_loss",
        "base_brier",
        "protected_brier",
        "base_ece",
        "protected_ece",
        "log10_S_end",
        pl.col("log10_martingale_max").alias("log10_S_max"),
        (pl.col("log10_martingale_max") >= config.ALARM_LOG10_THRESHOLD).alias("alarm"),
    )


def trajectory_frame(con, end: dt.date) -> pl.DataFrame:
    """End-of-day log10 martingale per stream and day up to ``end`` (the trajectory plot)."""
    return store.query(
        con,
        "SELECT date, stream, log10_martingale FROM calibrator_state WHERE date <= ? ORDER BY stream, date",
        [end],
    )


def reliability_frame(con, end: dt.date, days: int = RELIABILITY_WINDOW_DAYS) -> pl.DataFrame:
    """Protected rows of the ``days`` days ending on ``end`` (the reliability diagram)."""
    return store.read_partitions(
        con, "protected_scores", end - dt.timedelta(days=days - 1), end,
        columns=["stream", "base_score", "protected_score", "label"],
    )  # fmt: skip


def stream_summary(con) -> pl.DataFrame:
    """Whole-history summary per stream (what ``calpipe demo`` prints): events, base vs protected
    log loss / Brier / ECE, final and maximum log10 martingale, first alarm date."""
    scores = store.query(
        con,
        "SELECT stream, base_score, protected_score, label, log10_martingale FROM protected_scores",
    )
    stats = daily_metrics(scores, keys=("stream",))
    latest = store.query(
        con,
        """SELECT stream, log10_martingale AS final_log10_S, log10_martingale_max AS max_log10_S
           FROM calibrator_state QUALIFY row_number() OVER (PARTITION BY stream ORDER BY date DESC) = 1""",
    )
    alarms = store.query(
        con, "SELECT stream, min(date) AS first_alarm FROM martingale_alarms GROUP BY stream"
    )
    return (
        stats.join(latest, on="stream", how="left")
        .join(alarms, on="stream", how="left")
        .select(
            "stream",
            pl.col("n_events").alias("events"),
            pl.col("base_log_loss").alias("base_LL"),
            pl.col("protected_log_loss").alias("prot_LL"),
            pl.col("base_brier").alias("base_Brier"),
            pl.col("protected_brier").alias("prot_Brier"),
            pl.col("base_ece").alias("base_ECE"),
            pl.col("protected_ece").alias("prot_ECE"),
            "final_log10_S",
            "max_log10_S",
            "first_alarm",
        )
        .sort("stream")
    )


# ----------------------------------------------------------------------------------------------
# The whole job
# ----------------------------------------------------------------------------------------------
@dataclass
class RunSummary:
    """What :func:`run_range` did."""

    start: dt.date | None
    end: dt.date | None
    days: int
    events: int
    checks: list[CheckOutcome] = field(default_factory=list)


def default_range(con, source: EventSource) -> tuple[dt.date, dt.date] | None:
    """The nightly default: from the day after the last day stored (or the source's first day)
    to the source's last day. None if there is nothing to run."""
    rng = source.date_range(con)
    if rng is None:
        return None
    row = store.fetch_one(con, "SELECT max(date) FROM pipeline_days")
    start = rng[0] if row is None or row[0] is None else row[0] + dt.timedelta(days=1)
    return (start, rng[1]) if start <= rng[1] else None


def _stream_bucket(streams: pl.Series, k: int) -> np.ndarray:
    """Bucket 0..k-1 (k <= 256) of each stream name: a fixed hash, so a stream always lands in
    one bucket; uint8, so that numpy's stable argsort of the buckets is a radix sort."""
    return (streams.hash(seed=0) % k).cast(pl.UInt8).to_numpy()


def _stream_batches(events: pl.DataFrame) -> tuple[int, list[np.ndarray] | None]:
    """Split a day's events into k batches of whole streams of about
    :data:`calpipe.config.PROTECT_BATCH_ROWS` events: (k, each batch's row indices in the
    day's order), or (1, None) for a day that fits in one batch. Streams are independent, so
    running the batches one after the other gives each stream exactly its one-pass rows."""
    k = min(-(-events.height // config.PROTECT_BATCH_ROWS), 256)
    if k <= 1:
        return 1, None
    bucket = _stream_bucket(events["stream"], k)
    order = np.argsort(bucket, kind="stable")  # keeps each stream's rows in the day's order
    bounds = np.searchsorted(bucket[order], np.arange(k + 1))
    return k, [order[bounds[i] : bounds[i + 1]] for i in range(k)]


def _run_day(
    writer: store.PartitionWriter,
    source: EventSource,
    chain: _Chain,
    d: dt.date,
    chunk: pl.DataFrame,
) -> None:
    """Day ``d`` of :func:`run_range`, its events ``chunk`` read from the source: one batch of
    streams at a time (:func:`_stream_batches`), write its events, run the engine (which
    validates the data contract), and write the protected rows, monitoring and alarms from
    memory; then the day's state and ``pipeline_days`` rows."""
    # stored types already (the usual case): DuckDB writes a batch's events while the engine
    # validates and protects them (an invalid day rolls the transaction back); other types are
    # cast once validated, so that a bad type gets the contract's message. The events are
    # stored batch after batch: grouped by stream, which DuckDB writes and checkpoints faster
    # than streams interleaved in time (each stream keeps its rows in the source's order)
    early = dict(chunk.schema) == _EVENT_SCHEMA
    k, batches = _stream_batches(chunk)
    before = chain.state
    parts, n_active = [], 0
    for i in range(k):
        events = chunk if batches is None else chunk[batches[i]]
        state = before
        if k > 1 and before is not None:
            state = before.filter(pl.Series(_stream_bucket(before["stream"], k) == i))
        if early:
            writer.insert("scored_events", events, sort=False)
        try:
            r = chain.protect(events.select(_PROTECT_INPUT), state)
        except InputError as exc:
            raise _source_error(exc, source, events) from None
        if not early:
            writer.insert("scored_events", _stored_events(events), sort=False)
        protected = _protected_rows(chain.cal, r.scores, d)
        writer.insert("protected_scores", protected, sort=False)
        groups = _group_ids(protected, ["stream"])  # the same rows as r.scores
        state_d = r.state.with_columns(pl.lit(d, pl.Date).alias("date"))
        writer.insert("calibration_daily", _daily_rows(protected, state_d, d, groups))
        writer.insert("martingale_alarms", _first_crossings(r.scores, before, d, groups))
        parts.append(r.state)
        n_active += groups[1].shape[0]  # the batch's streams
        del events, r, protected, groups  # free the batch before the next one
    chain.state = parts[0] if k == 1 else pl.concat(parts).sort("stream")
    writer.insert("calibrator_state", chain.state.with_columns(pl.lit(d, pl.Date).alias("date")))
    writer.insert("pipeline_days", pl.DataFrame([chain.day_row(d, chunk.height, n_active)]))


def run_range(
    con,
    source: EventSource,
    start: dt.date | None = None,
    end: dt.date | None = None,
    settings: Settings | None = None,
    *,
    first_day: dt.date | None = None,
    log: Callable[[str], None] | None = None,
) -> RunSummary:
    """The nightly job without a daemon (``calpipe run``): the five stages over [start, end], then
    the data checks. Defaults: see :func:`default_range`; the chain's first day is the one stored,
    else ``start``. Raises on the first failed (non-warning) check.

    Writes the same rows as :func:`load_events`, :func:`protect_days`, :func:`monitor_days`,
    :func:`alarm_days` and :func:`map_days` one after the other (what the dagster assets run: the
    same helpers on the same rows, each stream's rows in the same order), but one day at a time
    from memory (:func:`_run_day`), every table of a day in one transaction (:func:`_write_days`):
    a day is read from the source once, validated once and never read back; memory is bounded
    by a batch of streams plus the day's events; and DuckDB writes a batch while the engine
    protects the next one (the writer's background INSERTs)."""
    settings = settings or Settings()
    if start is None:
        rng = default_range(con, source)
        if rng is None:
            return RunSummary(None, None, 0, 0)
        start = rng[0]
    if end is None:
        rng = source.date_range(con)
        if rng is None:
            return RunSummary(None, None, 0, 0)
        end = rng[1]
    start, end = _as_date(start), _as_date(end)
    if end < start:
        return RunSummary(None, None, 0, 0)
    first = _as_date(first_day or chain_first_day(con) or start)
    say = log or (lambda _msg: None)
    chain = _Chain(settings, first, state_before(con, start, settings, first))
    empty_days: list[dt.date] = []
    states: list[pl.DataFrame] = []

    def write(writer: store.PartitionWriter, d: dt.date, chunk: pl.DataFrame) -> None:
        if chunk.height == 0:
            empty_days.append(d)
        _run_day(writer, source, chain, d, chunk)
        states.append(chain.state.with_columns(pl.lit(d, pl.Date).alias("date")))

    def finish(writer: store.PartitionWriter, _d0: dt.date, _d1: dt.date) -> None:
        writer.insert("calibration_map", _map_rows(pl.concat(states), settings))
        states.clear()

    rows = _write_days(
        con, start, end, list(store.PARTITION_COLUMN),
        lambda d: _read_source(con, source, d, d), write, background=True, finish=finish,
    )  # fmt: skip
    empty = f", {len(empty_days)} day(s) without events" if empty_days else ""
    say(f"scored_events: {rows['scored_events']} events, {start}..{end}{empty}")
    say(f"protected_scores / calibrator_state: {rows['protected_scores']} rows")
    checks = [
        check_probabilities(con, start, end),
        check_row_counts(con, start, end),
        check_state_continuity(con, start, end),
        check_alarms(con, start, end),
    ]
    for c in checks:
        if not c.passed and not c.warning:
            raise CalpipeError(f"check {c.name} failed: {c.description}")
    days = (end - start).days + 1
    return RunSummary(start, end, days, rows["scored_events"], checks)


def bank_events(path: Path = BANK_FILE) -> pl.DataFrame:
    """The bank stream in the data contract: ``event_time = event_date``, ``score = score_rf1000``."""
    bank = pl.read_parquet(path)
    return bank.select(
        pl.lit(BANK_STREAM).alias("stream"),
        "event_id",
        pl.col("event_date").cast(pl.Datetime("us")).alias("event_time"),
        pl.col(BANK_SCORE).alias("score"),
        pl.col("label").cast(pl.Int32),
    )


def demo_events(
    *, seed: int = generate.DEFAULT_SEED, generated: Path = GENERATED_FILE
) -> pl.DataFrame:
    """The demo set: the bank stream and the seeded synthetic streams (the synthetic set is also
    written to ``generated``, by default ``data/generated/``, git-ignored)."""
    synthetic = generate.generate(seed=seed)
    generated.parent.mkdir(parents=True, exist_ok=True)
    tmp = generated.with_suffix(".parquet.tmp")
    synthetic.write_parquet(tmp)
    tmp.replace(generated)
    return pl.concat([bank_events(), synthetic], how="vertical_relaxed")


@dataclass
class DemoResult:
    db: Path
    landing: Path
    run: RunSummary
    summary: pl.DataFrame


def demo(
    db: str | Path | None = None,
    *,
    generated: Path = GENERATED_FILE,
    log: Callable[[str], None] | None = None,
) -> DemoResult:
    """``calpipe demo``: land the demo events (bank + synthetic) as daily Parquet folders in
    ``landing/`` next to the database, then run every daily partition in order from the first
    day (re-running the demo on the same database replaces every partition with identical rows).
    """
    db_path = Path(db or store.DEFAULT_DB).expanduser().resolve()
    landing = db_path.parent / "landing"
    events = demo_events(generated=generated)
    store.write_landing(events, landing)
    con = store.connect(db_path)
    try:
        source = EventSource("landing", str(landing))
        first, last = source.date_range(con)  # type: ignore[misc]
        recorded = chain_first_day(con)
        if recorded is not None and recorded != first:
            raise StateError(
                f"{db_path} holds a chain starting on {recorded}, not the demo's {first}"
            )
        run = run_range(con, source, first, last, Settings(), first_day=first, log=log)
        store.set_meta(con, "events", str(landing))
        store.set_meta(con, "first_day", first.isoformat())
        store.set_meta(con, "last_day", last.isoformat())
        store.set_meta(con, "settings", Settings().to_json())
        truth = generate.drift_table().select("stream", "drift_date")
        summary = stream_summary(con).join(truth, on="stream", how="left")
    finally:
        con.close()
    return DemoResult(db_path, landing, run, summary)
