"""The number of classes K a database stores: binary ``score`` columns, or K-class ``scores`` lists.

A database holds one kind of forecast, set by its first events like the event id type
(:mod:`calpipe.pipeline.ids`): binary (K = 2, a Float64 ``score`` of label 1 in
``scored_events``, ``base_score``/``protected_score`` in ``protected_scores``) or K classes
(K >= 3, ``scores``/``base_scores``/``protected_scores`` lists of K floats, the binary columns
NULL). K is read off the stored rows (every row has the same form, so one row tells), never
recorded apart from them: it cannot disagree with what is stored. A source's score column
holding lists of two probabilities [p0, p1] is binary: it is stored as ``score = p1``.

The frames of a night carry ``score`` (binary) or ``scores`` (K classes): :func:`score_column`.
"""

from __future__ import annotations

from calpipe import storage
from calpipe.storage import EventSource

#: The stored K: the first row of ``scored_events`` (binary if its ``score`` is set, else the
#: length of its ``scores``), else a ``calibrator_state`` row's ``n_classes``; NULL for a
#: database without either. Both reads stop at one row.
_STORED_SQL = """
SELECT coalesce(
    (SELECT CASE WHEN score IS NOT NULL THEN 2 ELSE len(scores) END FROM scored_events LIMIT 1),
    (SELECT n_classes FROM calibrator_state LIMIT 1))
"""


def stored_n_classes(con) -> int | None:
    """The number of classes of the forecasts this database stores (None before any event)."""
    row = storage.fetch_one(con, _STORED_SQL)
    return None if row is None or row[0] is None else int(row[0])


def ensure_n_classes(con, n_classes: int, source: EventSource, day) -> int:
    """``n_classes`` if this database stores forecasts of that many classes or none yet;
    StoreError naming both otherwise (one database keeps one kind of forecast: a chain's state
    and its metrics are those of K classes)."""
    have = stored_n_classes(con)
    if have is None or have == n_classes:
        return n_classes
    raise storage.StoreError(
        f"{source.describe()}, day {day}: its forecasts have {n_classes} classes, but this "
        f"database stores forecasts of {have} classes; one database keeps one number of classes: "
        "use a new database for this source"
    )
