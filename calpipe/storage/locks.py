"""Opening a DuckDB file that another process may hold: retries with backoff, then one clear
error naming that process (DuckDB allows one writing process per file, and a read-only
connection in another process blocks writers too)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb

from calpipe.errors import StoreError

#: How long a connection waits for a DuckDB file locked by another process before it gives up
#: (a notebook's query or a dagster step usually lets go within seconds; a nightly job should
#: not fail on one), retrying after 0.1 s, 0.2 s, ... at most 2 s apart.
LOCK_WAIT_SECONDS: float = 10.0
LOCK_RETRY_FIRST_SECONDS: float = 0.1
LOCK_RETRY_MAX_SECONDS: float = 2.0

#: DuckDB's words for a file locked by another process, and where it names that process.
_LOCKED = "Conflicting lock is held in"
_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.+?) \(PID (?P<pid>\d+)\)")


def open_waiting(p: Path, read_only: bool, wait: float) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, retried with exponential backoff while another process holds the
    lock (a notebook's read-only connection blocks a nightly run, and a run blocks ``calpipe
    sql``: both usually let go within seconds)."""
    deadline = time.monotonic() + max(0.0, wait)
    delay = LOCK_RETRY_FIRST_SECONDS
    while True:
        try:
            return duckdb.connect(str(p), read_only=read_only)
        except duckdb.IOException as exc:
            locked = _LOCKED in str(exc)
            if locked and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(2 * delay, LOCK_RETRY_MAX_SECONDS)
                continue
            how = "reading" if read_only else "writing"
            if not locked:
                raise StoreError(f"cannot open {p} for {how}: {exc}") from exc
            m = _LOCK_HOLDER.search(str(exc))
            who = f"{m['exe']} (PID {m['pid']})" if m else "another process"
            raise StoreError(
                f"cannot open {p} for {how}: it is locked by {who}, still after {wait:g} s. "
                "DuckDB allows one writing process per file, and a read-only connection in "
                "another process (a notebook, calpipe ui) blocks writers too: close it or stop "
                "that process, then run this again"
            ) from exc
