"""The conformance check of the calibrator protocol: :func:`check_calibrator`.

Like river's ``utils.estimator_checks.check_estimator``: one function that runs every invariant
of the protocol of :mod:`calpipe.calibrators.base` on small generated streams, so that a method
(or a change to one) is held to the same contract as every other. The invariants:

* **declared** -- the protocol's attributes have valid values, and ``params`` is complete (the
  method rebuilt from it has the same configuration);
* **valid outputs** -- forecasts are probabilities in [0, 1] (K-class rows sum to 1), the log10
  martingale is finite, every declared extra output is there, ``p_lower <= p <= p_upper``, and
  ``run_batch`` leaves the state it is given unchanged;
* **prequential** -- a forecast does not depend on its own label or on labels learnt after it;
* **streams independent** -- a stream's outputs and state are the same alone as in a batch
  (of 3 streams, and of enough streams for the kernels' multi-stream engines), and the row
  order of the event arrays does not matter;
* **chunked** -- the operations run in k chunks with the state carried equal one pass, bit for
  bit (outputs and end state);
* **state round trip** -- ``state_from_flat(state.flat())`` runs on exactly as the state itself;
* **stream order** -- permuting the streams of a batch (and of its state) permutes the results;
* **empty streams** -- streams without operations leave the other streams' results and their
  own initial state unchanged;
* **unlabelled events learn nothing** -- forecast-only operations leave the state unchanged;
* **serving map** -- ``serving_map(state, p)`` is the stream's next forecast of p;
* **run and StreamState** -- :meth:`~calpipe.calibrators.base.Calibrator.run` in chunks, the
  state carried through its JSON form, equals one ``run``;
* **two-class vectors** -- ``run`` and ``serving_map`` of ``[1 - p, p]`` equal the binary calls
  of p bit for bit (forecasts given back as ``[1 - p', p']``), and ``run_batch`` refuses
  (n, 2) scores (issue 36 item 3: they gave rows summing to 0.5, or NaN).

Every comparison is exact (bit for bit; NaN equals NaN). A broken invariant raises
AssertionError naming the method, its parameters, K and the invariant.

>>> from calpipe.calibrators import METHODS
>>> check_calibrator(METHODS["venn-predictor"])  # silent when the method conforms
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from calpipe.calibrators.base import Calibrator, RunOutput, StreamState
from calpipe.errors import InputError, ParameterError
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE

#: Streams of the wide batch: more than twice the 64 lanes of the binary mixture kernels'
#: multi-stream engine (:mod:`calpipe.kernels.mixture`), which only then takes streams.
WIDE_STREAMS = 150
#: Events of the three streams of the main batch: long enough for several fits and refits of
#: the small windows of every method's ``check_params``.
MAIN_LENGTHS = (48, 31, 40)
#: Labels flipped one at a time in the prequential check.
N_FLIPS = 6
#: Tolerance of "a K-class forecast sums to 1" and of the interval check (rounding only).
SUM_TOL = 1e-9


def check_calibrator(cal: type[Calibrator] | Calibrator, *, seed: int = 0) -> None:
    """Check that a method conforms to the calibrator protocol; raise AssertionError if not.

    Parameters
    ----------
    cal : Calibrator subclass or instance
        A class is built with each keyword set of its ``check_params`` in turn; an instance is
        checked as it is.
    seed : int
        Seed of the generated streams (binary, and K = 3 classes if the method takes them).

    Raises
    ------
    AssertionError
        On the first broken invariant, with the method, its parameters, K and the invariant.
    """
    if isinstance(cal, Calibrator):
        instances = [cal]
    else:
        if not cal.check_params:
            raise AssertionError(f"{cal.__name__}.check_params is empty: nothing would be checked")
        instances = [cal(**params) for params in cal.check_params]
    for i, inst in enumerate(instances):
        _check_declared(inst)
        for k in (2, 3) if inst.classes == "both" else (2,):
            _Check(inst, k, np.random.default_rng([seed, i, k])).run()


def _check_declared(cal: Calibrator) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise AssertionError(f"{cal!r}: invariant 'declared' broken: {what}")

    need(isinstance(cal.name, str) and cal.name != "", "name must be a non-empty string")
    need(isinstance(cal.summary, str) and cal.summary != "", "summary must be a non-empty string")
    need(cal.classes in ("binary", "both"), f"classes={cal.classes!r}, not 'binary' or 'both'")
    need(
        isinstance(cal.extra_outputs, tuple) and all(isinstance(x, str) for x in cal.extra_outputs),
        f"extra_outputs={cal.extra_outputs!r} is not a tuple of column names",
    )
    need(isinstance(cal.supports_label_time, bool), "supports_label_time must be a bool")
    need(set(cal.params) == set(cal.parameters), "params must hold every parameter of the table")
    again = type(cal)(**cal.params)
    need(
        again.fingerprint(2) == cal.fingerprint(2) and repr(again) == repr(cal),
        "the method rebuilt from its params must have the same configuration",
    )
    try:
        cal.check_classes(3)
        takes_k = True
    except ParameterError:
        takes_k = False
    need(takes_k == (cal.classes == "both"), "check_classes(3) must follow classes")


@dataclass(frozen=True)
class _Batch:
    """Events and an operation list of S streams, as :meth:`Calibrator.run_batch` takes them."""

    raw: np.ndarray  # (n,) or (n, K): the base scores as a user gives them
    scores: np.ndarray  # prepare_scores(raw)
    labels: np.ndarray  # (n,) int64 class indices (0 where unknown)
    op_event: np.ndarray
    op_kind: np.ndarray
    op_offsets: np.ndarray
    inputs: dict[str, np.ndarray]

    @property
    def n_streams(self) -> int:
        return self.op_offsets.shape[0] - 1

    def stream_ops(self, s: int) -> np.ndarray:
        return np.arange(self.op_offsets[s], self.op_offsets[s + 1])

    def shown(self) -> np.ndarray:
        """Events with a forecast operation here (their output rows are written)."""
        return self.op_event[self.op_kind != OP_UPDATE]

    def sub(self, ops_by_stream: list[np.ndarray]) -> tuple[_Batch, np.ndarray]:
        """The batch of these operations (one array per stream) and only their events: the
        batch and, for each of its events, the event's index here."""
        ops = np.concatenate(ops_by_stream).astype(np.int64)
        events, local = np.unique(self.op_event[ops], return_inverse=True)
        sizes = [len(o) for o in ops_by_stream]
        sub = _Batch(
            self.raw[events], self.scores[events], self.labels[events],
            local.astype(np.int64), self.op_kind[ops],
            np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            {k: v[events] for k, v in self.inputs.items()},
        )  # fmt: skip
        return sub, events

    def permuted_rows(self, perm: np.ndarray) -> _Batch:
        """Event i of the result is event ``perm[i]`` here; the operations follow their events."""
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.shape[0])
        return replace(
            self, raw=self.raw[perm], scores=self.scores[perm], labels=self.labels[perm],
            op_event=inv[self.op_event], inputs={k: v[perm] for k, v in self.inputs.items()},
        )  # fmt: skip


class _Check:
    """The invariants for one calibrator instance and one number of classes."""

    def __init__(self, cal: Calibrator, k: int, rng: np.random.Generator):
        self.cal, self.k, self.rng = cal, k, rng
        self.delayed = cal.supports_label_time

    def fail(self, invariant: str, detail: str) -> None:
        """Raise for ``invariant`` ("name" or "name: what it means here") with ``detail``."""
        name, _, meaning = invariant.partition(": ")
        raise AssertionError(
            f"{self.cal!r} (method {self.cal.name!r}, K = {self.k}): invariant '{name}' broken: "
            + (f"{meaning}: {detail}" if meaning else detail)
        )

    # -- data ----------------------------------------------------------------------------------
    def make_batch(self, lengths) -> _Batch:
        """Streams of the given lengths, rows shuffled: overconfident base scores (some exactly 0
        or 1, some tied), 15% of the labels unknown, and (if the method takes them) 30% of the
        known ones learnt 1 to 4 events late or not within the batch."""
        rng, k = self.rng, self.k
        n = int(sum(lengths))
        if k == 2:
            raw = rng.beta(2.0, 2.0, n)
            tied = rng.random(n) < 0.2
            raw[tied] = rng.integers(1, 10, int(tied.sum())) / 10.0
            truth = raw**2
            extreme = rng.random(n) < 0.05
            raw[extreme] = rng.integers(0, 2, int(extreme.sum()))
            y = (rng.random(n) < truth).astype(np.int64)
        else:
            raw = rng.dirichlet(np.ones(k), n)
            sharp = raw**2 * np.exp(np.linspace(0.0, 1.0, k))
            truth = sharp / sharp.sum(axis=1, keepdims=True)
            for i in np.flatnonzero(rng.random(n) < 0.05):
                raw[i] = np.eye(k)[rng.integers(0, k)]
            y = (rng.random(n)[:, None] > np.cumsum(truth, axis=1)).sum(axis=1)
            y = np.minimum(y, k - 1).astype(np.int64)
        known = rng.random(n) >= 0.15
        row = rng.permutation(n)  # event j of the concatenated streams sits at row row[j]
        op_event, op_kind, offsets = [], [], [0]
        start = 0
        for length in lengths:
            late: dict[int, list[int]] = {}  # position -> events whose label comes after it
            for j in range(start, start + length):
                e = int(row[j])
                if not known[e]:
                    op_event.append(e)
                    op_kind.append(OP_FORECAST)
                elif self.delayed and rng.random() < 0.3:
                    op_event.append(e)
                    op_kind.append(OP_FORECAST)
                    late.setdefault(j + int(rng.integers(1, 5)), []).append(e)
                else:
                    op_event.append(e)
                    op_kind.append(OP_STEP)
                for u in late.pop(j, []):
                    op_event.append(u)
                    op_kind.append(OP_UPDATE)
            start += length
            offsets.append(len(op_event))
        inputs = {}
        n_cat = self.cal.n_categories_input()
        for key in self.cal.input_columns():
            inputs[key] = rng.integers(0, n_cat or 1, n).astype(np.int64)
        return _Batch(
            np.ascontiguousarray(raw), self.cal.prepare_scores(raw), np.where(known, y, 0),
            np.array(op_event, dtype=np.int64), np.array(op_kind, dtype=np.int8),
            np.array(offsets, dtype=np.int64), inputs,
        )  # fmt: skip

    # -- running -------------------------------------------------------------------------------
    def run_batch(self, b: _Batch, state=None):
        if state is None:
            state = self.cal.initial_state(b.n_streams, self.k)
        return self.cal.run_batch(
            b.scores, b.labels, b.op_event, b.op_kind, b.op_offsets, state, b.inputs or None
        )

    def round_trip(self, state):
        values, offsets = state.flat()
        return self.cal.state_from_flat(values, offsets, state.log10m, self.k)

    def take_streams(self, state, idx):
        """Streams ``idx`` of ``state`` (through the flat form)."""
        values, offsets = state.flat()
        vectors = [values[offsets[s] : offsets[s + 1]] for s in idx]
        sizes = [v.shape[0] for v in vectors]
        return self.cal.state_from_flat(
            np.concatenate([np.zeros(0), *vectors]),
            np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            np.asarray(state.log10m)[idx], self.k,
        )  # fmt: skip

    # -- comparisons ---------------------------------------------------------------------------
    def columns(self, out: RunOutput, forecasts_only: bool = False) -> dict[str, np.ndarray]:
        cols = {"forecast": out.protected, **out.extra}
        if forecasts_only:  # the martingales depend on the label of their own event
            return {k: v for k, v in cols.items() if not k.startswith("log10_martingale")}
        return {**cols, "log10_martingale": out.log10_martingale}

    def same_rows(self, invariant, got, got_rows, want, want_rows, *, forecasts_only=False):
        """Rows ``got_rows`` of output ``got`` equal rows ``want_rows`` of ``want``."""
        g_cols = self.columns(got, forecasts_only)
        w_cols = self.columns(want, forecasts_only)
        for name, w in w_cols.items():
            g = g_cols.get(name)
            if g is None:
                self.fail(invariant, f"output {name!r} is missing")
            a, b = g[got_rows], w[want_rows]
            if not np.array_equal(a, b, equal_nan=True):
                bad = np.flatnonzero(~_equal_rows(a, b))[0]
                self.fail(
                    invariant,
                    f"output {name!r} of event {int(want_rows[bad])} is {a[bad].tolist()!r}, "
                    f"expected {b[bad].tolist()!r}",
                )

    def same_state(self, invariant, got, want, idx=None):
        """``got`` equals streams ``idx`` (all by default) of ``want``, bit for bit."""
        gv, go = got.flat()
        wv, wo = want.flat()
        idx = range(want.n_streams) if idx is None else idx
        if got.n_streams != len(idx):
            self.fail(invariant, f"state has {got.n_streams} streams, expected {len(idx)}")
        for j, s in enumerate(idx):
            a, b = gv[go[j] : go[j + 1]], wv[wo[s] : wo[s + 1]]
            if not np.array_equal(a, b, equal_nan=True):
                self.fail(invariant, f"state vector of stream {s} differs: {a!r} != {b!r}")
            if not _equal_rows(np.asarray(got.log10m)[j], np.asarray(want.log10m)[s]):
                self.fail(invariant, f"log10 martingale of stream {s} in the state differs")

    # -- the invariants ------------------------------------------------------------------------
    def run(self) -> None:
        main = self.make_batch(MAIN_LENGTHS)
        whole, end = self.valid_outputs(main)
        self.prequential(main, whole)
        self.independent(main, whole, end, alone=range(main.n_streams))
        wide = self.make_batch(self.rng.integers(1, 12, WIDE_STREAMS))
        wide_out, wide_end = self.valid_outputs(wide)
        self.independent(wide, wide_out, wide_end, alone=(0, 1, WIDE_STREAMS - 1))
        mid = self.chunked(main, whole, end)
        self.stream_order(main, mid, whole)
        self.empty_streams(main, whole, end)
        self.learns_nothing(main, mid)
        if not self.cal.input_columns():  # no serving map and no run() without the inputs
            self.serving(main, mid, whole)
            start = self.cal.initial_state(wide.n_streams, self.k)
            self.serving(wide, (start, np.zeros(wide.n_streams, np.int64)), wide_out)
            self.run_and_stream_state(main)
            if self.k == 2:
                self.two_class_vectors(main, mid)

    def valid_outputs(self, b: _Batch):
        inv = "valid outputs"
        state = self.cal.initial_state(b.n_streams, self.k)
        before = _snapshot(state)
        out, end = self.run_batch(b, state)
        if not _unchanged(before, state):
            self.fail(inv, "run_batch modified the state it was given")
        n = b.scores.shape[0]
        shown = b.shown()
        p = np.asarray(out.protected)
        if p.shape != b.scores.shape:
            self.fail(inv, f"forecasts have shape {p.shape}, the scores {b.scores.shape}")
        p = p[shown]
        if not (np.all(np.isfinite(p)) and np.all((p >= 0.0) & (p <= 1.0))):
            self.fail(inv, f"a forecast is not a probability: {p[~((p >= 0) & (p <= 1))][:3]}")
        if self.k > 2 and not np.allclose(p.sum(axis=1), 1.0, rtol=0.0, atol=SUM_TOL):
            self.fail(inv, "a K-class forecast does not sum to 1")
        m = np.asarray(out.log10_martingale)
        if m.shape != (n,) or not np.all(np.isfinite(m[shown])):
            self.fail(inv, "log10_martingale is not one finite number per forecast event")
        for name in self.cal.extra_outputs:
            if name not in out.extra or out.extra[name].shape[0] != n:
                self.fail(inv, f"extra output {name!r} is not one row per event")
        if "p_lower" in out.extra:
            lo, hi = out.extra["p_lower"][shown], out.extra["p_upper"][shown]
            known = ~np.isnan(lo)
            if np.any(lo[known] > p[known] + SUM_TOL) or np.any(p[known] > hi[known] + SUM_TOL):
                self.fail(inv, "p_lower <= forecast <= p_upper does not hold")
        if end.n_streams != b.n_streams or not np.all(np.isfinite(end.log10m)):
            self.fail(inv, "the new state does not hold S streams with finite martingales")
        return out, end

    def prequential(self, b: _Batch, whole: RunOutput) -> None:
        updates = np.flatnonzero(b.op_kind != OP_FORECAST)
        for o in self.rng.choice(updates, min(N_FLIPS, updates.size), replace=False):
            e = b.op_event[o]
            s = int(np.searchsorted(b.op_offsets, o, side="right") - 1)
            labels = b.labels.copy()
            labels[e] = (labels[e] + 1) % self.k
            out, _ = self.run_batch(replace(b, labels=labels))
            ops = np.arange(b.op_offsets[s], o + 1)
            before = b.op_event[ops[b.op_kind[ops] != OP_UPDATE]]
            self.same_rows(
                f"prequential: the label of event {e} changed a forecast made before it was learnt", out, before, whole, before, forecasts_only=True,
            )  # fmt: skip
            others = np.setdiff1d(b.shown(), b.op_event[b.stream_ops(s)])
            self.same_rows(
                f"streams independent: the label of event {e} of stream {s} changed another stream", out, others, whole, others,
            )  # fmt: skip

    def independent(self, b: _Batch, whole, end, alone) -> None:
        perm = self.rng.permutation(b.scores.shape[0])
        out, new = self.run_batch(b.permuted_rows(perm))
        inv = "row order: the event arrays shuffled change the results"
        self.same_rows(inv, out, np.argsort(perm)[b.shown()], whole, b.shown())
        self.same_state(inv, new, end)
        for s in alone:
            sub, events = b.sub([b.stream_ops(s)])
            out, new = self.run_batch(sub)
            shown = sub.shown()
            inv = f"streams independent: stream {s} alone differs from stream {s} in a batch"
            self.same_rows(inv, out, shown, whole, events[shown])
            self.same_state(inv, new, end, [s])

    def chunk_ops(self, b: _Batch, n_chunks: int) -> list[list[np.ndarray]]:
        """Each stream's operations cut at the same random fractions: chunk c, stream s. Every
        chunk keeps operations of every stream (a batch has no empty streams)."""
        edges = np.linspace(0.0, 1.0, n_chunks + 1)
        cuts = edges[1:-1] + self.rng.uniform(-0.3, 0.3, n_chunks - 1) / n_chunks
        out: list[list[np.ndarray]] = [[] for _ in range(n_chunks)]
        for s in range(b.n_streams):
            ops = b.stream_ops(s)
            for c, part in enumerate(np.split(ops, np.round(cuts * ops.size).astype(np.int64))):
                out[c].append(part)
        return out

    def chunked(self, b: _Batch, whole: RunOutput, end):
        """Three chunks with the state carried as it is, then through its flat form; returns the
        state after the first chunk and that chunk's op count per stream (for later checks)."""
        chunks = self.chunk_ops(b, 3)
        mid = None
        for inv, carry in (
            ("chunked: 3 chunks with the state carried differ from one pass", lambda st: st),
            ("state round trip: state_from_flat(state.flat()) runs on differently",
             self.round_trip),
        ):  # fmt: skip
            state = self.cal.initial_state(b.n_streams, self.k)
            for c, ops in enumerate(chunks):
                sub, events = b.sub(ops)
                out, state = self.run_batch(sub, state)
                shown = sub.shown()
                self.same_rows(inv, out, shown, whole, events[shown])
                if c == 0 and mid is None:
                    mid = (state, np.array([len(o) for o in ops]))
                state = carry(state)
            self.same_state(inv, state, end)
        values, offsets = mid[0].flat()
        again_values, again_offsets = self.round_trip(mid[0]).flat()
        if not (
            np.array_equal(values, again_values, equal_nan=True)
            and np.array_equal(offsets, again_offsets)
        ):
            self.fail("state round trip", "state_from_flat(state.flat()).flat() != state.flat()")
        return mid

    def rest_of(self, b: _Batch, mid) -> tuple[_Batch, np.ndarray]:
        """The operations after the first chunk (see :meth:`chunked`), as a batch."""
        done = mid[1]
        return b.sub([b.stream_ops(s)[done[s] :] for s in range(b.n_streams)])

    def empty_streams(self, b: _Batch, whole: RunOutput, end) -> None:
        """Streams without operations (first, between two others, last) change nothing: the
        others' outputs and states are the batch's own, and theirs stay the initial state (a
        call cut into pieces, :mod:`calpipe.engine.pieces`, has them whenever a stream is too
        short for a piece)."""
        inv = "empty streams: streams without operations changed the results"
        slots = [None]
        for s in range(b.n_streams):
            slots += [s, None]
        sizes = [0 if s is None else b.op_offsets[s + 1] - b.op_offsets[s] for s in slots]
        padded = replace(b, op_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        out, new = self.run_batch(padded)
        self.same_rows(inv, out, b.shown(), whole, b.shown())
        kept = [j for j, s in enumerate(slots) if s is not None]
        self.same_state(inv, self.take_streams(new, kept), end)
        empty = [j for j, s in enumerate(slots) if s is None]
        start = self.cal.initial_state(len(empty), self.k)
        self.same_state(inv, self.take_streams(new, empty), start)

    def stream_order(self, b: _Batch, mid, whole: RunOutput) -> None:
        rest, _ = self.rest_of(b, mid)
        order = np.arange(b.n_streams)[::-1]
        rev, rev_events = b.sub([b.stream_ops(s)[mid[1][s] :] for s in order])
        out, new = self.run_batch(rev, self.take_streams(mid[0], order))
        shown = rev.shown()
        inv = "stream order: the streams of a batch and its state reversed change the results"
        self.same_rows(inv, out, shown, whole, rev_events[shown])
        _, end = self.run_batch(rest, mid[0])
        self.same_state(inv, new, end, list(order))

    def learns_nothing(self, b: _Batch, mid) -> None:
        state = mid[0]
        ops = []
        for s in range(b.n_streams):
            forecasts = b.stream_ops(s)[b.op_kind[b.stream_ops(s)] != OP_UPDATE]
            ops.append(self.rng.choice(forecasts, min(4, forecasts.size), replace=False))
        sub, _ = b.sub(ops)
        sub = replace(sub, op_kind=np.full_like(sub.op_kind, OP_FORECAST))
        _, new = self.run_batch(sub, state)
        self.same_state("unlabelled events learn nothing: forecast-only ops changed the state",
                        new, state)  # fmt: skip

    def serving(self, b: _Batch, mid, whole: RunOutput) -> None:
        """serving_map(state, p) at a cut = the forecast of the stream's next op, if that op
        forecasts; and of several scores at once, row by row."""
        state, done = mid
        inv = "serving map: serving_map(state, p) is not the stream's next forecast of p"
        nxt = [b.op_offsets[s] + done[s] for s in range(b.n_streams)]
        has = [n < b.op_offsets[s + 1] and b.op_kind[n] != OP_UPDATE for s, n in enumerate(nxt)]
        events = np.array([b.op_event[n] if h else 0 for n, h in zip(nxt, has, strict=True)])
        x = b.raw[events][:, None]
        before = _snapshot(state)
        got = self.cal.serving_map(state, np.ascontiguousarray(x))
        if got.shape != x.shape:
            self.fail(inv, f"serving_map returned shape {got.shape} for scores {x.shape}")
        for s in np.flatnonzero(has):
            if not _equal_rows(got[s, 0], whole.protected[events[s]]).all():
                self.fail(
                    inv,
                    f"stream {s}: {got[s, 0].tolist()}, next forecast {whole.protected[events[s]].tolist()}",
                )
        grid = b.raw[self.rng.integers(0, b.raw.shape[0], (b.n_streams, 5))]
        many = self.cal.serving_map(state, np.ascontiguousarray(grid))
        for j in range(grid.shape[1]):
            one = self.cal.serving_map(state, np.ascontiguousarray(grid[:, j : j + 1]))
            if not np.array_equal(one[:, 0], many[:, j], equal_nan=True):
                self.fail(inv, "a score's map depends on the other scores mapped with it")
        if not _unchanged(before, state):
            self.fail(inv, "serving_map modified the state")

    def run_and_stream_state(self, b: _Batch) -> None:
        """``run`` on stream 0 in two chunks through the JSON form of StreamState = one run."""
        inv = "run and StreamState: two runs through StreamState JSON differ from one run"
        ops = b.stream_ops(0)
        events = b.op_event[ops[b.op_kind[ops] != OP_UPDATE]]  # each event once, in order
        known = np.isin(events, b.op_event[ops[b.op_kind[ops] != OP_FORECAST]])
        x, y = b.raw[events], np.where(known, b.labels[events], -1)
        out, st = self.cal.run(x, y)
        cut = events.shape[0] // 2
        out1, st1 = self.cal.run(x[:cut], y[:cut])
        text = st1.to_json()
        back = StreamState.from_json(text)
        if back != st1 or back.to_json() != text:
            self.fail(inv, "StreamState.from_json(state.to_json()) != state")
        out2, st2 = self.cal.run(x[cut:], y[cut:], state=back)
        rows = np.arange(events.shape[0])
        for part, sl in ((out1, rows[:cut]), (out2, rows[cut:])):
            self.same_rows(inv, part, np.arange(sl.size), out, sl)
        if st2 != st:
            self.fail(inv, f"end state {st2!r} != {st!r}")

    def two_class_vectors(self, b: _Batch, mid) -> None:
        """Two-class vectors ``[1 - p, p]`` are the binary p (docs/ARCHITECTURE.md §3): ``run``
        and ``serving_map`` on them equal the binary calls bit for bit, forecasts given back
        as ``[1 - p', p']``; ``run_batch``, which trusts no caller, refuses (n, 2) scores."""
        inv = "two-class vectors: [1 - p, p] is not the binary p"
        ops = b.stream_ops(0)
        events = b.op_event[ops[b.op_kind[ops] != OP_UPDATE]]
        known = np.isin(events, b.op_event[ops[b.op_kind[ops] != OP_FORECAST]])
        x, y = b.raw[events], np.where(known, b.labels[events], -1)
        two = np.column_stack([1.0 - x, x])
        x1 = two[:, 1]  # 1 - (1 - p) may differ from p in the last bit: the binary p1 is this
        out, st = self.cal.run(x1, y)
        vec, vst = self.cal.run(two, y)
        if vst != st:
            self.fail(inv, f"end state {vst!r} != {st!r}")
        for name, want in self.columns(out).items():
            got = self.columns(vec)[name]
            if name == "forecast" or name.endswith("_score"):
                want = np.column_stack([1.0 - want, want])
            if not np.array_equal(got, want, equal_nan=True):
                self.fail(inv, f"output {name!r} differs from the binary run's")
        state = mid[0]
        p = b.raw[self.rng.integers(0, b.raw.shape[0], (b.n_streams, 3))]
        both = self.cal.serving_map(state, np.ascontiguousarray(np.stack([1.0 - p, p], axis=2)))
        p1 = np.stack([1.0 - p, p], axis=2)[:, :, 1]
        one = self.cal.serving_map(state, np.ascontiguousarray(p1))
        if not np.array_equal(both, np.stack([1.0 - one, one], axis=2), equal_nan=True):
            self.fail(inv, "serving_map of [1 - p, p] differs from the binary map of p")
        try:
            self.cal.run_batch(np.ascontiguousarray(np.column_stack([1.0 - b.scores, b.scores])),
                               b.labels, b.op_event, b.op_kind, b.op_offsets,
                               self.cal.initial_state(b.n_streams, 2), b.inputs or None)  # fmt: skip
        except InputError:
            return
        self.fail(inv, "run_batch took (n, 2) score vectors (K = 2 garbage) instead of refusing")


def _equal_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise (rows of 2-D arrays as a whole) bit equality, NaN equal to NaN."""
    a, b = np.asarray(a), np.asarray(b)
    eq = (a == b) | (np.isnan(a) & np.isnan(b))
    return eq.all(axis=tuple(range(1, eq.ndim))) if eq.ndim > 1 else eq


def _snapshot(state) -> tuple[np.ndarray, ...]:
    values, offsets = state.flat()
    return values.copy(), offsets.copy(), np.array(state.log10m, dtype=np.float64)


def _unchanged(snapshot: tuple[np.ndarray, ...], state) -> bool:
    """``state`` still holds the values of ``snapshot`` (bit for bit)."""
    return all(
        np.array_equal(a, b, equal_nan=True)
        for a, b in zip(snapshot, _snapshot(state), strict=True)
    )
