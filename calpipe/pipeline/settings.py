"""What a stage returns: :class:`StageResult`, reported to its dagster asset or to ``calpipe run``.

(The chain's configuration, :class:`calpipe.night.settings.Settings`, is the night's.)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass
class StageResult:
    """What a stage wrote: the range, rows per table, and per-day notes for metadata."""

    start: dt.date
    end: dt.date
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
