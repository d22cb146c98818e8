"""What the study's scripts share: the quality suite's seven binary streams (cached once by
``np_streams.py``) and a run of composite-experts with given inputs on one of them."""

import os
from pathlib import Path

import numpy as np
import polars as pl

import calpipe

ROOT = Path(__file__).resolve().parents[3]
#: The streams' cache (``CALPIPE_STUDY_CACHE`` or the venv's folder: git-ignored).
CACHE = Path(os.environ.get("CALPIPE_STUDY_CACHE", ROOT / ".venv" / "studies" / "streams.npz"))
STREAMS = [
    "bank-time",
    "bank-by-age",
    "bank-by-balance",
    "bank-random",
    "phishing-arf",
    "bank-nb",
    "approval-daily",
]


def load():
    """The cached streams (``np_streams.py`` writes them): ``name|p``, ``name|y``, ``name|drift``."""
    return np.load(CACHE)


def run(p, y, inputs):
    n = len(y)
    f = pl.DataFrame({"event_id": np.arange(n), "label": y, "score": p})
    r = calpipe.protect(
        f, order_by="event_id", method="composite-experts", score="score", inputs=tuple(inputs)
    )
    return r["protected_score"].to_numpy()
