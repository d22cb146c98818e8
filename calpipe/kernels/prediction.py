"""The output of every calibrator kernel's ``predict``: the calibrated probability and, for the
interval (Venn) methods, the multiprobability bounds.

Binary methods give ``p`` of shape (n,), the probability of label 1; multiclass methods give
(n, K) rows summing to 1. ``p_lower``/``p_upper`` have the shape of ``p`` and satisfy
``p_lower <= p <= p_upper`` where a method promises it (Venn-ABERS: paper 002's multiprobability
[p0, p1]); they are ``None`` for point methods.

>>> import numpy as np
>>> Prediction(np.array([0.3])).p_lower is None
True
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Prediction(NamedTuple):
    p: np.ndarray
    p_lower: np.ndarray | None = None
    p_upper: np.ndarray | None = None
