"""calpipe.calibrators.online: the checks of a stored Venn predictor / online method state."""

from __future__ import annotations

import numpy as np
import pytest

from calpipe.calibrators import make_calibrator
from calpipe.calibrators.base import StreamState
from calpipe.errors import StateError


@pytest.mark.parametrize("value", [-1.0, 0.5])
@pytest.mark.parametrize("k", [2, 3])
def test_venn_counts_of_minus_one_are_refused_not_a_zero_division(value, k):
    # a count of -1 made n_k + 1 = 0: a raw ZeroDivisionError from the kernel
    cal = make_calibrator("venn-predictor", n_bins=2)
    x = np.array([0.2, 0.7, 0.9]) if k == 2 else np.full((3, k), 1.0 / k)
    _, st = cal.run(x, np.array([0, 1, 0]))
    st.weights = [value] * len(st.weights)
    st = StreamState.from_json(st.to_json())
    with pytest.raises(StateError, match="Venn counts must be whole numbers >= 0"):
        cal.run(x, np.array([1, -1, 0]), state=st)
