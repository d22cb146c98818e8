"""The nightly job: the functions that the dagster assets and the ``calpipe`` CLI both call.

A day ``d`` flows through five stages, each one function that reads its inputs from the DuckDB
file and replaces its output partitions in one transaction (:mod:`calpipe.store`):

=====================  ===========================================  ==========================
stage                  writes                                       reads
=====================  ===========================================  ==========================
:func:`load_events`    ``scored_events``                            the event source
:func:`protect_days`   ``protected_scores``, ``calibrator_state``,  ``scored_events`` of d,
                       ``pipeline_days``                            the state of d - 1
:func:`monitor_days`   ``calibration_daily``                        protected scores, state
:func:`alarm_days`     ``martingale_alarms``                        protected scores, state
:func:`map_days`       ``calibration_map``                          the state of d
=====================  ===========================================  ==========================

Every stage takes a range of days ``[start, end]`` (a single dagster partition is a range of one
day; a backfill is a longer one). :func:`protect_days` runs the days in order, one
:func:`calpipe.protect_with_state` call per day over all streams, carrying the state in memory,
and commits every :data:`CHUNK_DAYS` days; the other stages are vectorized over the range.
:func:`run_range` runs the five stages (the CLI's ``calpipe run``) and :func:`demo` is
``calpipe demo``.

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
from calpipe.frame import protect_with_state, resolve_columns, state_from_rows, validate_frame
from calpipe.store import EventSource

#: Days per transaction when a stage runs over a range: a month of a backfill is committed at
#: once (bounded memory, few commits); a single nightly partition is always one transaction.
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


def read_source_days(con, source: EventSource, start: dt.date, end: dt.date) -> pl.DataFrame:
    """Validated scored events of [start, end] from ``source`` (the rows ``load_events`` stores).

    Checks the data contract (DESIGN §3, via :func:`calpipe.frame.validate_frame`: scores in
    [0, 1], integer labels in {0, 1}, unique (stream, event_id), ...) and that each landing file's
    events fall on its folder's date. Raises :class:`calpipe.errors.InputError` naming the day,
    stream and event of the first offending row.
    """
    raw = source.read_range(con, start, end)
    if raw.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    days = raw[store.DAY_COLUMN]
    norm = store.normalize_events(raw.drop(store.DAY_COLUMN), source.columns)
    chunk = norm.with_columns(days.alias("event_date"))
    bad = chunk.filter(pl.col("event_time").cast(pl.Date) != pl.col("event_date"))
    if bad.height:
        r = bad.row(0, named=True)
        raise InputError(
            source.columns.event_time, None,
            f"{source.describe()}, day {r['event_date']}: event {r['event_id']} of stream "
            f"{r['stream']!r} has event_time {r['event_time']}, outside its day",
        )  # fmt: skip
    cols = resolve_columns(
        chunk.columns, score="score", scores=None, label="label", label_time=None,
        by=_BY, order_by=_ORDER,
    )  # fmt: skip
    try:
        validate_frame(chunk, cols)
    except InputError as exc:
        if exc.row is None:
            raise InputError(exc.column, None, f"{source.describe()}: {exc.rule}") from None
        r = chunk.row(exc.row, named=True)
        raise InputError(
            exc.column, None,
            f"{source.describe()}, day {r['event_date']}, stream {r['stream']!r}, event "
            f"{r['event_id']}: {exc.rule}",
        ) from None  # fmt: skip
    return chunk.select([pl.col(c).cast(t) for c, t in _EVENT_SCHEMA.items()])


def load_events(con, source: EventSource, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``scored_events``: validate the source's events of [start, end] and store them.

    A bad event fails the stage with a clear message and writes nothing for its chunk; a day
    without events stores an empty partition (and is still a day of the chain). The result's
    ``notes`` lists the days without events (a late landing shows up there).
    """
    start, end = _as_date(start), _as_date(end)
    res = StageResult(start, end, {"scored_events": 0})
    for c0, c1 in day_range(start, end):
        rows = read_source_days(con, source, c0, c1)
        store.replace_partitions(con, c0, c1, {"scored_events": rows})
        res.rows["scored_events"] += rows.height
        have = set(rows["event_date"].unique().to_list())
        res.notes += [d.isoformat() for d in store.iter_days(c0, c1) if d not in have]
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


def _empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=_EVENT_SCHEMA).drop("event_date")


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
    so far) and its ``pipeline_days`` row. Each chunk of :data:`CHUNK_DAYS` days is written in one
    transaction. ``first_day`` is the chain's first day (default: the one stored, else ``start``).
    """
    start, end = _as_date(start), _as_date(end)
    if first_day is None:
        first_day = chain_first_day(con) or start
    first_day = _as_date(first_day)
    cal = settings.calibrator()
    fp = cal.fingerprint(2)
    cfg = settings.to_json()
    state = state_before(con, start, settings, first_day)
    res = StageResult(start, end, {"protected_scores": 0, "calibrator_state": 0})
    for c0, c1 in day_range(start, end):
        events = store.read_partitions(con, "scored_events", c0, c1)
        by_day = events.partition_by("event_date", as_dict=True, include_key=False)
        scored, states, days = [], [], []
        for d in store.iter_days(c0, c1):
            ev = by_day.get((d,), _empty_events())
            r = protect_with_state(
                ev, score="score", label="label", by=_BY, order_by=_ORDER,
                method=settings.method, state=state, **settings.kwargs,
            )  # fmt: skip
            state = r.state
            dcol = pl.lit(d, pl.Date)
            scored.append(
                r.scores.with_columns(
                    dcol.alias("event_date"),
                    _martingale_base(cal, r.scores),
                    pl.lit(cal.name).alias("method"),
                    pl.lit(fp).alias("config_fingerprint"),
                ).drop("base_method_score", strict=False)
            )
            states.append(state.with_columns(dcol.alias("date")))
            days.append(
                {
                    "date": d, "first_day": first_day, "method": cal.name,
                    "config_fingerprint": fp, "config_json": cfg, "n_events": ev.height,
                    "n_streams": state.height, "n_active_streams": ev["stream"].n_unique(),
                }
            )  # fmt: skip
            if on_day is not None:
                on_day(d)
        frames = {
            "protected_scores": pl.concat(scored, how="vertical_relaxed"),
            "calibrator_state": pl.concat(states, how="vertical_relaxed"),
            "pipeline_days": pl.DataFrame(days),
        }
        store.replace_partitions(con, c0, c1, frames)
        res.rows["protected_scores"] += frames["protected_scores"].height
        res.rows["calibrator_state"] += frames["calibrator_state"].height
    return res


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
def daily_metrics(
    scores: pl.DataFrame, keys: Sequence[str] = ("event_date", "stream")
) -> pl.DataFrame:
    """Forecast quality of base vs protected per group (``keys``) of protected rows.

    Counts, mean natural log loss, Brier and ECE (:data:`ECE_BINS` equal-width bins) over the
    labelled events, mean base / protected score over all events, mean label over labelled
    ones, and the within-group maximum of the running log10 martingale. The base is
    ``base_score``, the score as the engine used it (clipped in log-loss mode), so that base
    minus protected cumulative log loss is the log test martingale.
    """
    b, p, y = "base_score", "protected_score", "label"
    return (
        scores.group_by(list(keys))
        .agg(
            pl.len().cast(pl.Int64).alias("n_events"),
            pl.col(y).is_not_null().sum().cast(pl.Int64).alias("n_labelled"),
            *metrics.base_vs_protected(b, p, y),
            metrics.ece(b, y, n_bins=ECE_BINS).alias("base_ece"),
            metrics.ece(p, y, n_bins=ECE_BINS).alias("protected_ece"),
            pl.col(b).mean().alias("mean_score"),
            pl.col(p).mean().alias("mean_protected"),
            pl.col(y).cast(pl.Float64).mean().alias("mean_label"),
            pl.col("log10_martingale").max().alias("log10_martingale_max"),
        )
        .sort(list(keys))
    )


def monitor_days(con, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``calibration_daily``: one row per stream with events per day of [start, end]."""
    start, end = _as_date(start), _as_date(end)
    _require_chain(con, start, end, "calibration_daily")
    res = StageResult(start, end, {"calibration_daily": 0})
    for c0, c1 in day_range(start, end):
        scores = store.read_partitions(
            con, "protected_scores", c0, c1,
            columns=["event_date", "stream", "base_score", "protected_score", "label", "log10_martingale"],
        )  # fmt: skip
        state = store.read_partitions(
            con, "calibrator_state", c0, c1,
            columns=["date", "stream", "log10_martingale", "log10_martingale_max"],
        )  # fmt: skip
        daily = (
            daily_metrics(scores)
            .rename({"event_date": "date"})
            .join(
                state.rename({"log10_martingale_max": "log10_martingale_max_to_date"}),
                on=["date", "stream"],
                how="left",
            )
            .with_columns(
                (pl.col("log10_martingale_max") >= config.ALARM_LOG10_THRESHOLD).alias("alarm")
            )
        )
        store.replace_partitions(con, c0, c1, {"calibration_daily": daily})
        res.rows["calibration_daily"] += daily.height
    return res


# ----------------------------------------------------------------------------------------------
# Stage 4: alarms
# ----------------------------------------------------------------------------------------------
def _max_before(con, day: dt.date) -> pl.DataFrame:
    return store.query(
        con,
        "SELECT stream, log10_martingale_max AS prev_max FROM calibrator_state WHERE date = ?",
        [day - dt.timedelta(days=1)],
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
        hits = store.query(
            con,
            """SELECT event_date AS date, stream, event_time, event_id, log10_martingale
               FROM protected_scores
               WHERE event_date BETWEEN ? AND ? AND log10_martingale >= ?
               QUALIFY row_number() OVER (PARTITION BY stream ORDER BY event_time, event_id) = 1""",
            [c0, c1, thr],
        )
        prev = _max_before(con, c0)
        alarms = (
            hits.join(prev, on="stream", how="left")
            .filter(pl.col("prev_max").fill_null(0.0) < thr)
            .drop("prev_max")
            .with_columns(pl.lit(thr).alias("threshold"))
        )
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
        if isinstance(settings.calibrator(), ProtectedCalibrator):
            terms = map_terms(state, settings)
        else:  # no SQL form of a fitted isotonic/Venn/... map: serve with serving_map()
            terms = pl.DataFrame(schema={"date": pl.Date, "stream": pl.String, "term": pl.Int32})
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
        """SELECT event_date, stream, event_id, protected_score, log10_martingale
           FROM protected_scores
           WHERE event_date BETWEEN ? AND ?
             AND (protected_score IS NULL OR isnan(protected_score) OR protected_score < 0
                  OR protected_score > 1 OR NOT isfinite(log10_martingale))
           ORDER BY event_date, stream, event_time, event_id LIMIT 10""",
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
    else ``start``. Raises on the first failed (non-warning) check."""
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
    first = first_day or chain_first_day(con) or start
    say = log or (lambda _msg: None)
    ev = load_events(con, source, start, end)
    empty = f", {len(ev.notes)} day(s) without events" if ev.notes else ""
    say(f"scored_events: {ev.rows['scored_events']} events, {start}..{end}{empty}")
    pr = protect_days(con, start, end, settings, first_day=first)
    say(f"protected_scores / calibrator_state: {pr.rows['protected_scores']} rows")
    monitor_days(con, start, end)
    alarm_days(con, start, end)
    map_days(con, start, end, settings)
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
    return RunSummary(start, end, days, ev.rows["scored_events"], checks)


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
