"""The chain of days in memory: the state carried from day to day and the rows it writes.

:class:`Chain` carries the state from day to day (one :func:`calpipe.protect_with_state` call
per day or batch of streams, with the calibrator object built once) and writes the rows of
``protected_scores`` (:func:`protected_rows`), ``calibrator_state`` (:func:`state_rows`: the
streams whose state changed) and ``pipeline_days`` (:meth:`Chain.day_row`, which extends the
state's hash chain: :func:`state_digest`, :func:`chain_hash`). Where the state of day d - 1 comes
from (the database) is the pipeline's (:mod:`calpipe.pipeline.chain`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import numpy as np
import polars as pl

from calpipe.calibrators import Calibrator
from calpipe.engine import protect_with_state
from calpipe.errors import StateError
from calpipe.night.arrivals import Arrivals, attach_labels, learn_late
from calpipe.night.changes import engine_state
from calpipe.night.classes import score_column
from calpipe.night.events import REPLAY_ORDER, STREAM_KEYS
from calpipe.night.settings import Settings

_DIGEST_NUMBERS = ("n_events", "n_labelled", "log10_martingale", "log10_martingale_max")

_DIGEST_LISTS = ("weights", "pending_label_time", "pending_scores", "pending_labels")


#: Interval outputs of the Venn methods, stored when the method produces them.
_INTERVAL_COLUMNS = ("p_lower", "p_upper")


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
        :data:`PROTECT_INPUT`) from ``state``, learning the night's label ``arrivals``: those of
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
            method=self.cal, state=learn_late(engine_state(state), late),
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


def state_digest(rows: pl.DataFrame) -> bytes:
    """SHA-256 of a day's ``calibrator_state`` rows (sorted by stream): the stream names, the
    counters, the martingale and every state and pending value, from their bytes (stable across
    library versions, unlike a frame's row hashes)."""
    return state_digests(rows.sort("stream"), np.array([0, rows.height]))[0]


def state_digests(rows: pl.DataFrame, bounds: np.ndarray) -> list[bytes]:
    """:func:`state_digest` of the slices ``rows[bounds[j]:bounds[j + 1]]`` (each sorted by
    stream already): the digests of a span's days from its state rows (sorted by day, then
    stream), converted once, not a frame per day."""
    streams = rows["stream"].to_list()
    numbers = [rows[c].to_numpy() for c in _DIGEST_NUMBERS]
    lists = []
    for c in _DIGEST_LISTS:
        col = rows[c]
        values = col.explode().drop_nulls().to_physical().cast(pl.Float64).to_numpy()
        kept = col.list.drop_nulls().list.len().fill_null(0).to_numpy().astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(kept)])
        lists.append((col.list.len().to_numpy().astype("int64"), values, starts))
    detector = _detector_arrays(rows)
    out = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        h = hashlib.sha256()
        h.update("\0".join(streams[a:b]).encode())
        for x in numbers:
            h.update(x[a:b].tobytes())
        for lengths, values, starts in lists:
            h.update(lengths[a:b].tobytes())
            h.update(values[starts[a] : starts[b]].tobytes())
        # the change detector's state, once a day's rows carry it (a database's rows from before
        # it, all NULL, hash as they did: their recorded chain still verifies)
        if detector is not None and detector[0][a:b].any():
            for x in detector[1]:
                h.update(x[a:b].tobytes())
            lengths, values, starts = detector[2]
            h.update(lengths[a:b].tobytes())
            h.update(values[starts[a] : starts[b]].tobytes())
        out.append(h.digest())
    return out


def _detector_arrays(rows: pl.DataFrame):
    """The change detector's columns of state rows as bytes-ready arrays (None without them):
    which rows carry it, its numbers (NULL as a sentinel) and its reference map as a list."""
    if "change_count" not in rows.columns:
        return None
    present = rows["change_count"].is_not_null().to_numpy()
    numbers = [
        rows["change_log10_cusum"].fill_null(-1.0).to_numpy(),
        rows["change_run_start"].to_physical().fill_null(-1).to_numpy(),
        rows["change_run_labels"].fill_null(-1).to_numpy(),
        rows["change_count"].fill_null(-1).to_numpy(),
        rows["change_reference_date"].to_physical().fill_null(-1).to_numpy(),
        rows["change_settle_labels"].fill_null(-1).to_numpy(),
    ]
    col = rows["change_reference"]
    values = col.explode().drop_nulls().to_numpy()
    kept = col.list.len().fill_null(0).to_numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(kept)])
    return (
        present,
        numbers,
        (col.list.len().fill_null(-1).to_numpy().astype("int64"), values, starts),
    )


def chain_hash(prev: str | None, digest: bytes) -> str:
    """``state_hash`` of a day: the previous day's ``state_hash`` (None on the chain's first day)
    and the day's :func:`state_digest`."""
    return hashlib.sha256((prev or "").encode() + digest).hexdigest()
