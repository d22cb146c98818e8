"""Stage ``protected_scores`` + ``calibrator_state`` + ``pipeline_days``: the chain of days.

Owns the chain's rules (the first day, the state of day d - 1 that day d starts from, and the
:class:`calpipe.errors.StateError` when it is missing or was computed under another
configuration), :class:`Chain` (the state carried in memory from day to day, one
:func:`calpipe.protect_with_state` call per day or batch of streams), and the rows of the three
tables (:func:`protected_rows`, :func:`state_rows`, :meth:`Chain.day_row`), which the stage
(:func:`protect_days`) and the fused run (``calpipe/pipeline/tables.py``) both write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from calpipe import storage
from calpipe.calibrators import Calibrator
from calpipe.engine import protect_with_state
from calpipe.errors import StateError
from calpipe.pipeline.classes import score_column, stored_n_classes
from calpipe.pipeline.events import REPLAY_ORDER, STREAM_KEYS, protect_columns
from calpipe.pipeline.inputs import chain_hash, state_digest
from calpipe.pipeline.labels import Arrivals, attach_labels, learn_late, stored_arrivals
from calpipe.pipeline.settings import Settings, StageResult, as_date
from calpipe.pipeline.transactions import write_days


def chain_first_day(con) -> dt.date | None:
    """The first day of the chain stored in this database (None before the first run)."""
    row = storage.fetch_one(con, "SELECT min(first_day) FROM pipeline_days")
    return None if row is None else row[0]


def _first_missing_day(con, first_day: dt.date, before: dt.date) -> dt.date | None:
    done = {
        r[0]
        for r in con.execute(
            "SELECT date FROM pipeline_days WHERE date BETWEEN ? AND ?", [first_day, before]
        ).fetchall()
    }
    for d in storage.iter_days(first_day, before):
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
    row = storage.fetch_one(
        con,
        "SELECT first_day, method, config_fingerprint, config_json, n_streams FROM pipeline_days "
        "WHERE date = ?",
        [prev],
    )
    if row is None:
        missing = _first_missing_day(con, first_day, prev)
        raise StateError(
            f"cannot run day {day}: day {prev} has no calibrator state. The chain starts on "
            f"{first_day}; materialize the days in order (first missing day: {missing}), or run a "
            f"backfill from {missing} to {day}"
        )
    rec_first, method, fp, cfg, n_streams = row
    if rec_first != first_day:
        raise StateError(
            f"cannot run day {day}: this database's chain starts on {rec_first}, but this run "
            f"says the first day is {first_day}"
        )
    want = settings.fingerprint_for(stored_n_classes(con) or 2)
    if fp != want:
        raise StateError(
            f"cannot run day {day}: day {prev} was computed by {method!r} with config "
            f"fingerprint {fp} ({cfg}), this run is {settings.method!r} with fingerprint "
            f"{want} ({settings.to_json()}); loading a state under another "
            "configuration is an error: use the same method options, or a new database"
        )
    altered = _state_rows_missing(con, first_day, prev)
    if altered is not None:  # deleted rows would resume those streams from an older state
        d, n_rows, n_recorded = altered
        raise StateError(
            f"cannot run day {day}: calibrator_state of {d} has {n_rows} rows, but "
            f"pipeline_days recorded {n_recorded} streams whose state changed that day; the state "
            f"was altered outside calpipe: restore it, or re-run from the chain's first day "
            f"{first_day} into a new database"
        )
    state = state_as_of(con, prev)
    if state.height != n_streams:
        raise StateError(
            f"cannot run day {day}: calibrator_state holds {state.height} streams up to {prev}, "
            f"but pipeline_days recorded {n_streams} streams at the end of that day; the state "
            f"was altered outside calpipe: restore it, or re-run from the chain's first day "
            f"{first_day} into a new database"
        )
    return state.drop("date")


#: The state of every stream at the end of day $1: its latest ``calibrator_state`` row on or
#: before it (a day stores the rows of the streams whose state changed, :func:`state_rows`).
#: The latest dates are found on two narrow columns first, so that only the needed rows' state
#: vectors are read.
_STATE_AS_OF_SQL = """
SELECT s.* FROM calibrator_state s
JOIN (SELECT stream, max(date) AS date FROM calibrator_state WHERE date <= $1 GROUP BY stream) l
  USING (stream, date)
ORDER BY s.stream
"""


def state_hash_before(con, day: dt.date) -> str | None:
    """The ``state_hash`` of ``day - 1`` (None on the chain's first day or for a day computed
    before calpipe recorded it): where the hash chain of the days from ``day`` on starts."""
    row = storage.fetch_one(
        con, "SELECT state_hash FROM pipeline_days WHERE date = ?", [day - dt.timedelta(days=1)]
    )
    return None if row is None else row[0]


def state_as_of(con, day: dt.date) -> pl.DataFrame:
    """The calibrator state of every stream at the end of ``day`` (one row per stream, with the
    ``date`` of the row it comes from): each stream's latest ``calibrator_state`` row on or
    before ``day``. What :func:`calpipe.pipeline.serving_map` takes to serve the map in force
    then, and what the ``calibrate_score_as_of`` macro evaluates in SQL."""
    return storage.query(con, _STATE_AS_OF_SQL, [as_date(day)])


def _state_rows_missing(con, first_day: dt.date, last: dt.date) -> tuple | None:
    """The first day of [first_day, last] whose ``calibrator_state`` row count differs from the
    ``n_state_rows`` that ``pipeline_days`` recorded: (day, rows, recorded), or None. Reads the
    date column only (a stream's rows are sparse: a deleted row would go unnoticed by the state
    as of a later day, which would quietly resume that stream from an older row)."""
    return storage.fetch_one(
        con,
        """SELECT d.date, coalesce(c.n, 0), d.n_state_rows FROM pipeline_days d
           LEFT JOIN (SELECT date, count(*) AS n FROM calibrator_state
                      WHERE date BETWEEN $1 AND $2 GROUP BY date) c USING (date)
           WHERE d.date BETWEEN $1 AND $2 AND coalesce(c.n, 0) <> d.n_state_rows
           ORDER BY d.date LIMIT 1""",
        [first_day, last],
    )


def base_score_column(cal: Calibrator, scores: pl.DataFrame) -> pl.Series:
    """``base_score`` (``base_scores`` for K classes): the forecast the martingale bets against
    (the clipped base, or a stack's base-method forecast), so that base loss - protected loss =
    ln 10 * log10 S."""
    if "scores" in scores.columns:
        col = "base_method_scores" if "base_method_scores" in scores.columns else "scores"
        vec = scores[col]
        k = int(vec.list.len().max()) if vec.len() else 3
        x = vec.list.to_array(k).to_numpy() if vec.len() else np.zeros((0, k))
        seen = cal.martingale_base(np.ascontiguousarray(x, dtype=np.float64))
        return pl.Series("base_scores", seen).cast(pl.List(pl.Float64))
    col = "base_method_score" if "base_method_score" in scores.columns else "score"
    return pl.Series("base_score", cal.martingale_base(scores[col].to_numpy()))


def _day_events_sql(n_classes: int) -> str:
    """A day's scored events in their stored order (the source's: deterministic, so the day's
    protected_scores rows, written in the same order, are too). No ORDER BY: calpipe.protect
    groups the streams by hashing and finds an event log already in time order without a sort,
    where a SQL sort by (stream, event_time, event_id) would cost more than the protection."""
    cols = ", ".join(protect_columns(n_classes))
    return f"SELECT {cols} FROM scored_events WHERE event_date = ?"


#: Interval outputs of the Venn methods, stored when the method produces them.
_INTERVAL_COLUMNS = ("p_lower", "p_upper")


def protected_rows(cal: Calibrator, scores: pl.DataFrame, day: dt.date | None) -> pl.DataFrame:
    """The ``protected_scores`` rows of one day (``day=None``: of the days of the rows' own
    ``event_date``): the event key and the engine's outputs only (``v_protected_scores`` joins
    the inputs, method and fingerprint back). K classes: ``base_scores``/``protected_scores``
    vectors in place of the binary columns."""
    out = "protected_scores" if "scores" in scores.columns else "protected_score"
    return scores.select(
        pl.lit(day, pl.Date).alias("event_date") if day is not None else "event_date",
        "stream",
        "event_id",
        base_score_column(cal, scores),
        pl.col("label").cast(pl.Int32),
        pl.col(out).cast(pl.List(pl.Float64)) if out == "protected_scores" else out,
        "log10_martingale",
        # the intervals of a binary forecast (multiclass Venn-ABERS gives none: NULL)
        *[c for c in _INTERVAL_COLUMNS if c in scores.columns and out == "protected_score"],
    )


def state_rows(state: pl.DataFrame, day: dt.date, active: pl.Series) -> pl.DataFrame:
    """The ``calibrator_state`` rows of ``day``: the end-of-day state of the streams whose state
    changed that day (``active``: the streams with events or with labels of earlier events
    arriving, :func:`changed_streams`), keyed by the day.

    A stream without events keeps its state, so its latest row (of an earlier day) stays its
    state: the state at the end of day d is each stream's latest row on or before d
    (:data:`_STATE_AS_OF_SQL`). Idle streams cost no rows, so history grows with the events,
    not with the days times the streams ever seen."""
    return state.filter(pl.col("stream").is_in(active.implode())).with_columns(
        pl.lit(day, pl.Date).alias("date")
    )


def changed_streams(streams: pl.Series, arrivals: Arrivals | None) -> pl.Series:
    """The streams whose state a night changes: those with events (``streams``: of the night's
    events, repeated or not), and those with labels of earlier events arriving (their pending
    updates grow)."""
    if arrivals is not None and arrivals.late.height:
        streams = pl.concat([streams, arrivals.streams()])
    return streams.unique()


def check_outputs(scores: pl.DataFrame, day: dt.date) -> None:
    """StateError naming the day, stream and event of the first protected score that is not a
    probability or martingale that is not finite: checked before the day is committed (the
    post-commit check ``probabilities_valid`` would find it only once it was stored)."""
    name = "protected_scores" if "protected_scores" in scores.columns else "protected_score"
    m = pl.col("log10_martingale")
    if name == "protected_score":
        p = pl.col(name)
        invalid = p.is_null() | p.is_nan() | (p < 0) | (p > 1)
    else:  # every class's probability in [0, 1] (the vectors sum to 1 by construction)
        p = pl.col(name).list.eval(pl.element().is_nan() | (pl.element() < 0) | (pl.element() > 1))
        invalid = pl.col(name).is_null() | p.list.any()
    bad = scores.filter(invalid | ~m.is_finite())
    if bad.height:
        r = bad.row(0, named=True)
        raise StateError(
            f"day {day}, stream {r['stream']!r}, event {r['event_id']}: {name} "
            f"{r[name]} / log10_martingale {r['log10_martingale']} is not a finite "
            f"probability ({bad.height} such events); nothing of the day is written"
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


class Chain:
    """A chain run day after day: the settings, and the state carried in memory (one small row
    per stream) from one day to the next."""

    def __init__(
        self,
        settings: Settings,
        first_day: dt.date,
        state: pl.DataFrame | None,
        state_hash,
        n_classes: int | None = None,
    ):
        self.settings, self.first_day, self.state = settings, first_day, state
        self.state_hash = state_hash  # of the state carried (pipeline/inputs.py's hash chain)
        self.cfg = settings.to_json()
        self.id_type = None  # the database's event id type once a day of this run checked it
        self.use_classes(n_classes or 2)

    def use_classes(self, n_classes: int) -> None:
        """Run forecasts of ``n_classes`` classes (the database's, :mod:`~calpipe.pipeline.
        classes`: set by the first events of a new database). ParameterError if the method
        does not take that many classes."""
        self.n_classes = n_classes
        self.cal = self.settings.calibrator(n_classes)
        self.fp = self.cal.fingerprint(n_classes)

    def protect(
        self,
        events: pl.DataFrame,
        state: pl.DataFrame | None,
        arrivals: Arrivals | None = None,
        late: pl.DataFrame | None = None,
    ):
        """One :func:`calpipe.protect_with_state` call over the streams of ``events`` (columns
        :data:`_PROTECT_INPUT`) from ``state``, learning the night's label ``arrivals``: those of
        the events go to their rows (:func:`~calpipe.pipeline.labels.attach_labels`), ``late``
        (the arrivals of ``state``'s streams for earlier events) to the state's pending updates
        (:func:`~calpipe.pipeline.labels.learn_late`). Raises InputError for events that break
        the data contract (validated there)."""
        events = attach_labels(events, arrivals)
        if late is not None and late.height and not self.cal.supports_label_time:
            raise StateError(
                f"method {self.cal.name!r} does not take delayed labels: the label feed needs a "
                "method that does (`calpipe methods`)"
            )
        col = score_column(self.n_classes)
        return protect_with_state(
            events, **{col: col}, label="label", by=STREAM_KEYS, order_by=REPLAY_ORDER,
            label_time="label_time" if "label_time" in events.columns else None,
            method=self.cal, state=learn_late(state, late),
        )  # fmt: skip

    def day_row(
        self,
        day: dt.date,
        n_events: int,
        n_active: int,
        rows: pl.DataFrame,
        n_arrivals: int = 0,
        n_streams: int | None = None,
        digest: bytes | None = None,
    ) -> dict[str, Any]:
        """The ``pipeline_days`` row of ``day`` (call once per day, in order); ``rows``: its
        ``calibrator_state`` rows (:func:`state_rows`), which extend the state's hash chain
        (``digest``: their :func:`~calpipe.pipeline.inputs.state_digest`, if known);
        ``n_streams``: the streams in the state at the end of the day (default: in the state
        carried, when it is the day's)."""
        if n_streams is None:
            n_streams = 0 if self.state is None else self.state.height
        digest = state_digest(rows) if digest is None else digest
        prev, self.state_hash = self.state_hash, chain_hash(self.state_hash, digest)
        return {
            "date": day, "first_day": self.first_day, "method": self.cal.name,
            "config_fingerprint": self.fp, "config_json": self.cfg, "n_events": n_events,
            "n_streams": n_streams,
            "n_active_streams": n_active, "n_state_rows": rows.height,
            "state_hash": self.state_hash, "prev_state_hash": prev,
            "n_label_arrivals": n_arrivals,
        }  # fmt: skip

    def step(self, events: pl.DataFrame, day: dt.date, arrivals: Arrivals | None = None) -> _Day:
        """Run ``day``'s events (columns :data:`_PROTECT_INPUT`) from the carried state, with
        the night's label ``arrivals``: one :meth:`protect` call over all streams."""
        late = None if arrivals is None else arrivals.late
        r = self.protect(events, self.state, arrivals, late)
        check_outputs(r.scores, day)  # before anything of the day is written
        before, self.state = self.state, r.state
        rows = state_rows(r.state, day, changed_streams(events["stream"], arrivals))
        n_arrivals = 0 if arrivals is None else arrivals.rows.height
        return _Day(
            r.scores,
            protected_rows(self.cal, r.scores, day),
            rows,
            self.day_row(day, events.height, events["stream"].n_unique(), rows, n_arrivals),
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
    transactions of whole days (:func:`write_days`): only one day's events and the small state
    frame are held in memory. ``first_day`` is the chain's first day (default: the one stored,
    else ``start``).
    """
    start, end = as_date(start), as_date(end)
    if first_day is None:
        first_day = chain_first_day(con) or start
    first_day = as_date(first_day)
    k = stored_n_classes(con) or 2
    chain = Chain(
        settings, first_day, state_before(con, start, settings, first_day),
        state_hash_before(con, start), k,
    )  # fmt: skip

    def write(writer: storage.PartitionWriter, d: dt.date, events: pl.DataFrame) -> None:
        day = chain.step(events, d, stored_arrivals(con, d, k))
        # in the input's order (the engine keeps it): no sort of the day's rows
        writer.insert("protected_scores", day.protected, sort=False)
        writer.insert("calibrator_state", day.state)
        writer.insert("pipeline_days", pl.DataFrame([day.day_row]))
        if on_day is not None:
            on_day(d)

    tables = ["protected_scores", "calibrator_state", "pipeline_days"]
    rows = write_days(
        con, start, end, tables, lambda d: storage.query(con, _day_events_sql(k), [d]), write
    )
    return StageResult(start, end, {t: rows[t] for t in tables[:2]})


def require_chain(con, start: dt.date, end: dt.date, what: str) -> None:
    missing = _first_missing_day(con, start, end)
    if missing is not None:
        raise StateError(
            f"cannot compute {what} for {missing}: protected_scores/calibrator_state of {missing} "
            "have not been materialized"
        )
