"""Progress on the terminal: a bar over the days of ``calpipe run`` / ``calpipe demo``, a bar
over the events of a long ``calpipe protect`` and a status line for its other phases and for a
short one (rich, on standard error).

Shown only when standard error is a terminal (a cron job's log gets the usual lines, not a
redrawn bar) and not with ``--no-progress``. The first run on a machine compiles the kernels
(10-50 s, cached afterwards): the bar says so until its first day is done, instead of sitting
silent at 0.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def enabled(no_progress: bool = False) -> bool:
    """Whether to draw: standard error is a terminal and the user did not say --no-progress."""
    return not no_progress and sys.stderr.isatty()


def kernels_cached() -> bool:
    """Whether numba's cache directory already holds compiled calpipe kernels (the first run on
    a machine, or after an upgrade, compiles them)."""
    folder = os.environ.get("NUMBA_CACHE_DIR")
    return bool(folder) and any(Path(folder).rglob("*.nbi"))


class DayBar:
    """The days of a run: ``start(total)``, ``advance(day, events)`` per day, ``stop()``.
    Passed to :func:`calpipe.pipeline.run_range` as its ``progress``."""

    def __init__(self, label: str, *, show: bool):
        self.label = label
        self.show = show
        self._progress: Progress | None = None
        self._task = None
        self._events = 0

    def start(self, total: int) -> None:
        if not self.show:
            return
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("days · {task.fields[events]:,} events"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,  # the run's own summary lines stay; the bar goes when it is done
        )
        self._progress.start()
        first = "" if kernels_cached() else " (compiling the kernels: first run only)"
        self._task = self._progress.add_task(self.label + first, total=total, events=0)

    def advance(self, day: dt.date, events: int) -> None:
        if self._progress is None:
            return
        self._events += events
        self._progress.update(
            self._task, advance=1, events=self._events, description=f"{self.label} {day}"
        )

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class RateColumn(ProgressColumn):
    """Events per second (rich's estimate over the task's recent advances; at the end, the
    rate it finished at)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        shown = "-" if speed is None else f"{speed:,.0f}"
        return Text(f"{shown} events/s", style="progress.data.speed")


class EventBar:
    """The events of one ``calpipe protect``: ``with EventBar(label, total=n, show=...) as
    bar``, then ``bar.advance(events)`` as they are protected (the engine's ``progress``:
    :func:`calpipe.protect_with_state`). Events done of the total, their rate, the time spent
    and the time left; gone when the block ends (also on Ctrl-C or an error)."""

    def __init__(self, label: str, *, total: int, show: bool):
        self.label, self.total, self.show = label, total, show
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> EventBar:
        if self.show:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,} events"),
                RateColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,  # the summary stays; the bar goes when the events are done
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
            # drawn now, from this thread: rich's refresh thread needs the GIL, which a numba
            # kernel holds for a whole piece, so the bar's first frame (and the word
            # "protecting" that tests/cli/test_ctrl_c.py waits for) could come at the end
            self._progress.refresh()
        return self

    def advance(self, events: int) -> None:
        if self._progress is not None:  # between pieces: drawn here, for the same reason
            self._progress.update(self._task, advance=events, refresh=True)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


@contextmanager
def status(message: str, *, show: bool):
    """A spinner with ``message`` while the block runs (nothing when not shown)."""
    if not show:
        yield
        return
    with Console(stderr=True).status(message):
        yield
