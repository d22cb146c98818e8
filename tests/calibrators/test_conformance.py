"""calpipe.calibrators.checks: every registered method (and stacks) conforms to the protocol, and
the check fails, naming the invariant, on calibrators that break one."""

from __future__ import annotations

import numpy as np
import pytest

from calpipe.calibrators import METHODS
from calpipe.calibrators.base import RunOutput
from calpipe.calibrators.batch import Platt
from calpipe.calibrators.checks import check_calibrator
from calpipe.calibrators.protected import CompositeJumper
from calpipe.calibrators.stacked import Stacked
from calpipe.kernels.ops import OP_UPDATE


@pytest.mark.parametrize("cls", [*METHODS.values(), Stacked], ids=[*METHODS, "stacked"])
def test_every_method_conforms(cls):
    check_calibrator(cls)


def test_an_instance_is_checked_as_it_is():
    check_calibrator(Stacked(CompositeJumper(pi=0.3), Platt(window=4)))


# -- calibrators that break one invariant each ------------------------------------------------
def _shown(op_event, op_kind):
    return op_event[op_kind != OP_UPDATE]


class Peeking(Platt):
    """Moves each forecast towards its own label: not prequential."""

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        out, new = super().run_batch(scores, labels, op_event, op_kind, op_offsets, state, inputs)
        ev = _shown(op_event, op_kind)
        out.protected[ev] = 0.9 * out.protected[ev] + 0.1 * labels[ev]
        return out, new


class Crowded(Platt):
    """Shrinks its forecasts in batches of several streams: streams are not independent."""

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        out, new = super().run_batch(scores, labels, op_event, op_kind, op_offsets, state, inputs)
        if op_offsets.shape[0] > 2:
            out.protected[:] = 0.5 + 0.99 * (out.protected - 0.5)
        return out, new


class Amnesiac(Platt):
    """Starts every batch afresh: k chunks are not one pass."""

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        fresh = self.initial_state(state.n_streams, 2 if scores.ndim == 1 else scores.shape[1])
        return super().run_batch(scores, labels, op_event, op_kind, op_offsets, fresh, inputs)


class Rounding(Platt):
    """Loads stored state vectors in float32 precision: the state does not round-trip."""

    def state_from_flat(self, values, offsets, log10m, n_classes):
        rounded = np.asarray(values, dtype=np.float32).astype(np.float64)
        return super().state_from_flat(rounded, offsets, log10m, n_classes)


class Overshooting(Platt):
    """Forecasts 1.5 p: not a probability."""

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        out, new = super().run_batch(scores, labels, op_event, op_kind, op_offsets, state, inputs)
        return RunOutput(out.protected * 1.5, out.log10_martingale, out.extra), new


class Mutating(Platt):
    """Writes into the state it is given."""

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        out, new = super().run_batch(scores, labels, op_event, op_kind, op_offsets, state, inputs)
        state.log10m[:] = new.log10m
        return out, new


class StaleServing(Platt):
    """Serves the base scores whatever the state."""

    def serving_map(self, state, scores):
        return np.array(scores, dtype=np.float64)


class ForgetfulJumper(CompositeJumper):
    """Loses its weights across batches but keeps its martingale: chunks differ from one pass."""

    def state_from_flat(self, values, offsets, log10m, n_classes):
        fresh = self.initial_state(np.asarray(log10m).shape[0], n_classes)
        fresh.log10m = np.array(log10m, dtype=np.float64)
        return fresh


@pytest.mark.parametrize(
    ("cls", "invariant"),
    [
        (Peeking, "prequential"),
        (Crowded, "streams independent"),
        (Amnesiac, "chunked"),
        (Rounding, "state round trip"),
        (Overshooting, "valid outputs"),
        (Mutating, "valid outputs"),
        (StaleServing, "serving map"),
        (ForgetfulJumper, "state round trip"),
    ],
)
def test_the_check_catches_a_broken_calibrator(cls, invariant):
    with pytest.raises(AssertionError, match=f"invariant '{invariant}") as err:
        check_calibrator(cls)
    assert f"{cls.__name__}(" in str(err.value)  # it names the calibrator and its parameters


def test_a_class_without_check_params_is_refused():
    class Unchecked(Platt):
        check_params = ()

    with pytest.raises(AssertionError, match="check_params is empty"):
        check_calibrator(Unchecked)
