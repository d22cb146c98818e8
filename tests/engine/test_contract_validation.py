"""Bad input, bad parameters and mismatched state through :func:`calpipe.protect_with_state`.

Every case checks the exception type (:mod:`calpipe.errors`) and that the message names what is
wrong: for input errors the column, the 0-based row *of the input frame* and the rule; for
parameter errors the parameter and its rule; for state errors both fingerprints or both keys.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import calpipe
from calpipe.errors import CalpipeError, InputError, ParameterError, StateError
from tests.conftest import make_events

T = dt.datetime(2024, 3, 1)

# Rows in input order; the replay order is a1 (row 1), a2 (row 4), a3 (row 0), b1, b2, b3.
# Bad values go to rows 2 and 4: the first offending *input* row is 2, while the first offending
# row in replay order would be 4, so a message naming row 2 really points at the input.
STREAM = ["a", "a", "b", "b", "a", "b"]
HOURS = [3, 1, 2, 1, 2, 3]
BAD_ROWS = (2, 4)
FIRST_BAD = 2


def binary_frame(**replace) -> pl.DataFrame:
    """Six valid binary events; ``replace={column: value}`` puts ``value`` in rows 2 and 4."""
    data = {
        "stream": list(STREAM),
        "event_time": [T + dt.timedelta(hours=h) for h in HOURS],
        "event_id": list(HOURS),
        "score": [0.2, 0.7, 0.4, 0.9, 0.5, 0.35],
        "label": [0, 1, None, 1, 0, 1],
    }
    for col, value in replace.items():
        for r in BAD_ROWS:
            data[col][r] = value
    return pl.DataFrame(
        data, schema_overrides={"score": pl.Float64, "label": pl.Int64, "event_id": pl.Int64}
    )


def multiclass_frame(**replace) -> pl.DataFrame:
    data = {
        "stream": list(STREAM),
        "event_time": [T + dt.timedelta(hours=h) for h in HOURS],
        "event_id": list(HOURS),
        "scores": [
            [0.2, 0.3, 0.5],
            [0.1, 0.8, 0.1],
            [0.3, 0.3, 0.4],
            [0.6, 0.2, 0.2],
            [0.25, 0.25, 0.5],
            [1 / 3, 1 / 3, 1 / 3],
        ],
        "label": [2, None, 0, 1, 1, 0],
    }
    for col, value in replace.items():
        for r in BAD_ROWS:
            data[col][r] = value
    return pl.DataFrame(data, schema_overrides={"scores": pl.List(pl.Float64), "label": pl.Int64})


def delayed_frame(**replace) -> pl.DataFrame:
    df = binary_frame()
    lt = [
        T + dt.timedelta(hours=h + 1) if y is not None else None
        for h, y in zip(HOURS, df["label"], strict=True)
    ]
    for col, value in replace.items():
        assert col == "label_time"
        for r in BAD_ROWS:
            lt[r] = value
    return df.with_columns(pl.Series("label_time", lt, dtype=pl.Datetime("us")))


def assert_input_error(exc: BaseException, column: str, row: int | None, *rule: str) -> None:
    assert type(exc) is InputError
    assert (exc.column, exc.row) == (column, row)
    msg = str(exc)
    assert f"column {column!r}" in msg, msg
    if row is not None:
        assert f"row {row}" in msg, msg
    for word in rule:
        assert word in msg, msg


# ----------------------------------------------------------------------------------------------
# The valid frames are valid (so each case below fails for its one fault only)
# ----------------------------------------------------------------------------------------------
def test_the_valid_frames_pass():
    assert calpipe.protect(binary_frame()).height == 6
    assert calpipe.protect(multiclass_frame(), scores="scores").height == 6
    assert calpipe.protect(delayed_frame(), label_time="label_time").height == 6


# ----------------------------------------------------------------------------------------------
# Input errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("drop", "kw"),
    [
        ("score", {}),
        ("label", {}),
        ("event_time", {}),
        ("event_id", {}),
        (None, {"by": "segment"}),
        (None, {"label_time": "label_time"}),
        (None, {"scores": "probs"}),
        (None, {"order_by": ["ts", "event_id"]}),
    ],
)
def test_missing_column_is_named(drop, kw):
    df = binary_frame() if drop is None else binary_frame().drop(drop)
    missing = drop or next(v if isinstance(v, str) else v[0] for v in kw.values())
    with pytest.raises(InputError) as e:
        calpipe.protect_with_state(df, **kw)
    assert_input_error(e.value, missing, None, "missing column")


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (None, "null score"),
        (float("nan"), "NaN"),
        (-0.1, "outside [0, 1]"),
        (1.1, "outside [0, 1]"),
        (-1e-12, "outside [0, 1]"),
        (float("inf"), "outside [0, 1]"),
    ],
)
def test_bad_score_names_column_first_input_row_and_rule(value, rule):
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame(score=value))
    assert_input_error(e.value, "score", FIRST_BAD, rule)


def test_scores_exactly_0_and_1_are_valid():
    df = binary_frame().with_columns(pl.Series("score", [0.0, 1.0, 0.0, 1.0, 0.5, 0.5]))
    out = calpipe.protect(df)
    assert out["protected_score"].is_between(0, 1).all()


def test_score_of_a_non_numeric_dtype_is_rejected():
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame().with_columns(pl.col("score").cast(pl.String)))
    assert_input_error(e.value, "score", None, "float", "String")


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ([0.5, 0.5], "another length"),
        ([0.25, 0.25, 0.25, 0.25], "another length"),
        ([1.0], ">= 2 classes"),
        (None, "null scores"),
        ([0.5, None, 0.5], "null inside"),
        ([0.5, float("nan"), 0.5], "NaN"),
        ([0.5, 0.6, -0.1], "outside [0, 1]"),
        ([0.5, 0.5 + 2e-6, 0.0], "sum to 1"),
        ([0.5, 0.5 - 2e-6, 0.0], "sum to 1"),
        ([0.4, 0.4, 0.4], "sum to 1"),
    ],
)
def test_bad_multiclass_scores_name_column_first_input_row_and_rule(value, rule):
    with pytest.raises(InputError) as e:
        calpipe.protect(multiclass_frame(scores=value), scores="scores")
    assert_input_error(e.value, "scores", FIRST_BAD, rule)


@pytest.mark.parametrize("value", [[0.5, 0.5 + 5e-7, 0.0], [0.5, 0.5 - 9e-7, 0.0]])
def test_scores_summing_to_1_within_the_tolerance_are_accepted(value):
    out = calpipe.protect(multiclass_frame(scores=value), scores="scores")
    assert out.height == 6


def test_multiclass_array_scores_are_validated_too():
    df = multiclass_frame(scores=[0.5, 0.5 + 2e-6, 0.0]).with_columns(
        pl.col("scores").cast(pl.Array(pl.Float64, 3))
    )
    with pytest.raises(InputError) as e:
        calpipe.protect(df, scores="scores")
    assert_input_error(e.value, "scores", FIRST_BAD, "sum to 1")


@pytest.mark.parametrize(("value", "k"), [(2, 2), (-1, 2), (7, 2), (3, 3), (-1, 3)])
def test_label_outside_the_classes(value, k):
    if k == 2:
        df, kw = binary_frame(label=value), {}
    else:
        df, kw = multiclass_frame(label=value), {"scores": "scores"}
    with pytest.raises(InputError) as e:
        calpipe.protect(df, **kw)
    assert_input_error(e.value, "label", FIRST_BAD, "label outside the classes", f"0..{k - 1}")


def test_labels_of_a_float_dtype_are_the_integer_labels():
    """0.0 / 1.0 labels (as scikit-learn and pandas give them) used to be refused: they are the
    integer labels, output for output."""
    df = binary_frame()
    for method in ("composite-experts", "venn-abers"):
        want = calpipe.protect(df, method=method)
        got = calpipe.protect(df.with_columns(pl.col("label").cast(pl.Float64)), method=method)
        assert_frame_equal(got.drop("label"), want.drop("label"))


@pytest.mark.parametrize(
    ("value", "rule"),
    [(0.5, "not a whole number"), (float("nan"), "label is NaN"), (float("inf"), "infinite"),
     (2.0, "label outside the classes")],
)  # fmt: skip
def test_a_float_label_that_is_not_a_class_names_its_row(value, rule):
    labels = pl.Series("label", [0.0, 1.0, None, 1.0, 0.0, 1.0], dtype=pl.Float64)
    df = binary_frame().with_columns(labels.scatter(list(BAD_ROWS), value))
    with pytest.raises(InputError) as e:
        calpipe.protect(df)
    assert_input_error(e.value, "label", FIRST_BAD, rule)


def test_label_of_a_string_dtype_is_rejected():
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame().with_columns(pl.col("label").cast(pl.String)))
    assert_input_error(e.value, "label", None, "integers or whole floats")


def test_duplicate_stream_and_event_id_names_the_second_occurrence():
    df = binary_frame()
    # row 4 (stream a) gets row 0's event id 3; its event_time differs, still a duplicate
    df = df.with_columns(df["event_id"].scatter(4, 3))
    with pytest.raises(InputError) as e:
        calpipe.protect(df)
    assert_input_error(e.value, "event_id", 4, "duplicate", "stream", "event_id")


def test_same_event_id_in_different_streams_is_not_a_duplicate():
    df = binary_frame()
    assert df.filter(pl.col("event_id") == 1).height == 2  # a1 and b1
    assert calpipe.protect(df).height == 6


@pytest.mark.parametrize("column", ["stream", "event_time", "event_id"])
def test_null_in_a_stream_or_order_key(column):
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame(**{column: None}))
    assert_input_error(e.value, column, FIRST_BAD, "null in a stream or order key")


def test_label_time_before_event_time():
    df = delayed_frame()
    # rows 0 (a3) and 4 (a2) are labelled; row 0 comes first in the input, row 4 in replay order
    df = df.with_columns(df["label_time"].scatter([0, 4], T - dt.timedelta(minutes=1)))
    with pytest.raises(InputError) as e:
        calpipe.protect(df, label_time="label_time")
    assert_input_error(e.value, "label_time", 0, "before the event", "event_time")


def test_label_time_equal_to_event_time_is_accepted():
    df = binary_frame()
    df = df.with_columns(
        pl.when(pl.col("label").is_not_null()).then(pl.col("event_time")).alias("label_time")
    )
    assert calpipe.protect(df, label_time="label_time").height == 6


def test_a_labelled_event_without_label_time_is_known_at_its_event():
    """A null label_time on a labelled event used to be an error; it now means the label was
    known at its event (as without label_time), so instant and delayed labels mix."""
    df = delayed_frame()
    df = df.with_columns(df["label_time"].scatter(4, None))
    out = calpipe.protect(df, label_time="label_time")
    assert out.height == df.height
    moved = calpipe.protect(
        df.with_columns(df["label_time"].scatter(4, df["event_time"][4] + dt.timedelta(days=30))),
        label_time="label_time",
    )
    # the label of row 4 is seen by a later event only when it is known at the event
    assert not out["protected_score"].equals(moved["protected_score"])


def test_label_time_given_for_an_unlabelled_event():
    df = delayed_frame()
    df = df.with_columns(df["label_time"].scatter(2, T + dt.timedelta(days=1)))
    with pytest.raises(InputError) as e:
        calpipe.protect(df, label_time="label_time")
    assert_input_error(e.value, "label_time", 2, "without a label")


def test_label_time_needs_a_temporal_event_time():
    df = delayed_frame().with_columns(pl.col("event_time").dt.hour().cast(pl.Int64))
    with pytest.raises(InputError) as e:
        calpipe.protect(df, label_time="label_time")
    assert_input_error(e.value, "event_time", None, "Date/Datetime")


@pytest.mark.parametrize(
    "times", [["2020-1-9", "2020-1-10"] * 3, ["tuesday", "monday"] * 3], ids=["dates", "days"]
)
def test_a_text_event_time_is_refused_not_replayed_in_text_order(times):
    # issue 36 item 3: "2020-1-10" sorted before "2020-1-9" and "tuesday" was accepted
    df = binary_frame().with_columns(pl.Series("event_time", times))
    for call in (calpipe.protect, calpipe.protect_with_state):
        with pytest.raises(InputError) as e:
            call(df)
        assert_input_error(e.value, "event_time", None, "time column", "Date/Datetime", "String")
        assert "text order" in str(e.value)


def test_a_numeric_event_time_is_still_a_replay_order():
    df = binary_frame().with_columns(pl.col("event_time").dt.hour().cast(pl.Int64))
    assert calpipe.protect(df).height == df.height


def test_an_output_column_already_in_the_input_is_rejected():
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame().with_columns(pl.lit(0.0).alias("log10_martingale")))
    assert_input_error(e.value, "log10_martingale", None, "already exists")


def test_score_and_scores_together_are_rejected():
    with pytest.raises(InputError, match=r"either score= .* or scores="):
        calpipe.protect(binary_frame(), score="score", scores="score")


def test_input_errors_are_value_errors():
    with pytest.raises(ValueError):
        calpipe.protect(binary_frame(score=2.0))
    assert issubclass(InputError, CalpipeError)


# ----------------------------------------------------------------------------------------------
# Parameter errors
# ----------------------------------------------------------------------------------------------
def param_error(method: str = "composite-jumper", frame=None, **params) -> str:
    with pytest.raises(ParameterError) as e:
        calpipe.protect(binary_frame() if frame is None else frame, method=method, **params)
    assert type(e.value) is ParameterError
    return str(e.value)


def test_unknown_method_lists_the_methods():
    msg = param_error("composite_jumper")
    assert "unknown method 'composite_jumper'" in msg
    for name in ("jumper", "mean-jumper", "composite-jumper"):
        assert name in msg


@pytest.mark.parametrize("method", ["jumper", "mean-jumper", "composite-jumper"])
def test_unknown_parameter_lists_the_parameters(method):
    msg = param_error(method, alpha=1.0)
    assert "unknown parameter" in msg and "'alpha'" in msg
    for p in ("family", "family_params", "jumping_rates", "clip"):
        assert p in msg


def test_pi_is_not_a_parameter_of_the_jumper():
    msg = param_error("jumper", pi=0.5)
    assert "unknown parameter" in msg and "'pi'" in msg


@pytest.mark.parametrize("method", ["jumper", "mean-jumper", "composite-jumper"])
@pytest.mark.parametrize("rate", [0, 0.0, 1.5, -0.1, float("nan"), float("inf")])
def test_jumping_rate_outside_0_1(method, rate):
    rates = [rate] if method == "jumper" else [1.0, rate]
    msg = param_error(method, jumping_rates=rates)
    assert "jumping_rates" in msg and "(0, 1]" in msg


@pytest.mark.parametrize("method", ["jumper", "mean-jumper", "composite-jumper"])
def test_jumping_rate_1_is_accepted(method):
    out = calpipe.protect(binary_frame(), method=method, jumping_rates=[1.0])
    assert out.height == 6


@pytest.mark.parametrize("pi", [0, 0.0, 1, 1.0, -0.5, 1.5, float("nan"), True, "0.5", None])
def test_pi_outside_0_1(pi):
    msg = param_error(pi=pi)
    assert "pi=" in msg and "(0, 1)" in msg


def test_mean_jumper_needs_rate_1():
    msg = param_error("mean-jumper", jumping_rates=[0.1, 0.01])
    assert "jumping_rates" in msg and "J = 1" in msg


def test_mean_jumper_rates_must_be_distinct():
    msg = param_error("mean-jumper", jumping_rates=[1.0, 0.1, 0.1])
    assert "jumping_rates" in msg and "distinct" in msg


def test_composite_jumper_rates_must_be_distinct():
    msg = param_error(jumping_rates=[0.01, 0.01])
    assert "jumping_rates" in msg and "distinct" in msg


def test_jumper_takes_exactly_one_rate():
    msg = param_error("jumper", jumping_rates=[0.01, 0.001])
    assert "jumping_rates" in msg and "exactly one" in msg


@pytest.mark.parametrize("method", ["jumper", "mean-jumper", "composite-jumper"])
@pytest.mark.parametrize(
    ("family", "grid", "rule"),
    [
        ("quadratic", [0.0, 2.0], "[-1, 1]"),
        ("quadratic", [[0.0, 0.5]], "[-1, 1]"),
        ("cubic", [0.5], "pairs in [0, 1]^2"),
        ("cubic", [(0.0, 0.5), (2.0, 0.5)], "pairs in [0, 1]^2"),
        ("cox", [1.0, -1.0], "betas > 0"),
        ("cox", [1.0, 0.0], "betas > 0"),
        ("cox2", [(0.0, 1.0), (1.0, 0.0)], "beta > 0"),
        ("cox2", [], "non-empty"),
        ("cox2", [(0.0, float("nan"))], "finite"),
        ("cox2", ["a"], "not a list of numbers"),
    ],
)
def test_bad_family_params(method, family, grid, rule):
    msg = param_error(method, family=family, family_params=grid)
    assert "family_params" in msg and repr(family) in msg and rule in msg


@pytest.mark.parametrize("family", ["Cox", "logistic", None])
def test_unknown_family(family):
    msg = param_error(family=family)
    assert "family=" in msg and "quadratic, cubic, cox, cox2" in msg


def test_family_params_must_be_a_sequence():
    msg = param_error(family="cox", family_params="0.5")
    assert "family_params" in msg and "sequence" in msg


def test_composite_jumper_family_must_contain_the_identity():
    msg = param_error(family="cox", family_params=[0.5, 2.0])
    assert "identity" in msg


def test_binary_only_family_with_multiclass_scores():
    msg = param_error("jumper", frame=multiclass_frame(), scores="scores", family="quadratic")
    assert "binary-only" in msg and "'quadratic'" in msg


@pytest.mark.parametrize(
    "custom",
    [{"family": "cox"}, {"family_params": [(0.0, 1.0), (1.0, 1.0)]}, {"family": "quadratic"}],
)
def test_brier_loss_with_a_custom_family(custom):
    msg = param_error(loss="brier", **custom)
    assert "brier" in msg and "cox2" in msg and "family_params=None" in msg


def test_unknown_loss():
    msg = param_error(loss="hinge")
    assert "loss=" in msg and "'log'" in msg and "'brier'" in msg


@pytest.mark.parametrize("clip", [0, 0.5, -0.1, 1.0, "0.01"])
def test_clip_outside_0_half(clip):
    msg = param_error(clip=clip)
    assert "clip=" in msg and "(0, 0.5)" in msg


# ----------------------------------------------------------------------------------------------
# State errors
# ----------------------------------------------------------------------------------------------
def _later(df: pl.DataFrame, days: int = 30) -> pl.DataFrame:
    return df.with_columns(pl.col("event_time") + dt.timedelta(days=days))


def test_state_under_another_pi_names_both_fingerprints():
    df = make_events(1, n_events=30)
    state = calpipe.protect_with_state(df, method="composite-jumper").state
    old = calpipe.make_calibrator("composite-jumper").fingerprint(2)
    new = calpipe.make_calibrator("composite-jumper", pi=0.3).fingerprint(2)
    assert old != new
    with pytest.raises(StateError) as e:
        calpipe.protect_with_state(_later(df), state=state, method="composite-jumper", pi=0.3)
    msg = str(e.value)
    assert old in msg and new in msg and "composite-jumper" in msg


@pytest.mark.parametrize(
    ("written", "loaded"),
    [
        ({"method": "composite-jumper"}, {"method": "jumper"}),
        ({"method": "jumper"}, {"method": "jumper", "jumping_rates": [0.1]}),
        ({"method": "mean-jumper"}, {"method": "mean-jumper", "clip": 0.01}),
        ({"method": "composite-jumper"}, {"method": "composite-jumper", "loss": "brier"}),
        ({"method": "composite-jumper"}, {"method": "composite-jumper", "family": "cox"}),
    ],
)
def test_state_under_another_configuration_is_an_error(written, loaded):
    df = make_events(2, n_events=30)
    state = calpipe.protect_with_state(df, **written).state
    with pytest.raises(StateError) as e:
        calpipe.protect_with_state(_later(df), state=state, **loaded)
    assert state["config_fingerprint"][0] in str(e.value)


def test_binary_state_with_multiclass_events_is_an_error():
    df = make_events(3, n_events=30)
    state = calpipe.protect_with_state(df).state
    mc = _later(make_events(3, n_events=30, n_classes=3))
    with pytest.raises(StateError, match="K = 3"):
        calpipe.protect_with_state(mc, scores="scores", state=state)


@pytest.mark.parametrize(("dt_hours", "did"), [(0, 0), (0, -1), (-1, 5), (-24, 100)])
def test_resuming_with_events_not_after_the_last_key(dt_hours, did):
    df = make_events(4, n_events=30)
    state = calpipe.protect_with_state(df).state
    last = state.filter(pl.col("stream") == "s1").row(0, named=True)
    event = pl.DataFrame(
        {
            "stream": ["s1"],
            "event_time": [last["last_event_time"] + dt.timedelta(hours=dt_hours)],
            "event_id": [last["last_event_id"] + did],
            "score": [0.5],
            "label": [1],
        }
    )
    with pytest.raises(StateError) as e:
        calpipe.protect_with_state(event, state=state)
    msg = str(e.value)
    assert "s1" in msg and "not after the state's last processed key" in msg
    assert f"event_id={last['last_event_id']}" in msg


def test_resuming_with_the_next_event_id_at_the_same_time_is_accepted():
    df = make_events(4, n_events=30)
    state = calpipe.protect_with_state(df).state
    last = state.filter(pl.col("stream") == "s1").row(0, named=True)
    event = pl.DataFrame(
        {
            "stream": ["s1"],
            "event_time": [last["last_event_time"]],
            "event_id": [last["last_event_id"] + 1],
            "score": [0.5],
            "label": [1],
        }
    )
    res = calpipe.protect_with_state(event, state=state)
    assert res.state.filter(pl.col("stream") == "s1")["n_events"].item() == last["n_events"] + 1


def test_state_frame_of_other_keys_is_an_error():
    df = make_events(5, n_events=30)
    state = calpipe.protect_with_state(df).state.rename({"stream": "segment"})
    with pytest.raises(StateError, match="stream"):
        calpipe.protect_with_state(_later(df), state=state)


def test_several_state_rows_for_one_stream_is_an_error():
    df = make_events(6, n_events=30)
    state = calpipe.protect_with_state(df).state
    one = _later(df).drop("stream").unique("event_id", keep="first").sort("event_id")
    with pytest.raises(StateError, match="several rows"):
        calpipe.protect_with_state(one, state=state.drop("stream"), by=())


# ----------------------------------------------------------------------------------------------
# Nothing is returned or changed on error
# ----------------------------------------------------------------------------------------------
def test_inputs_are_unchanged_after_an_error():
    df = make_events(7, n_events=30)
    state = calpipe.protect_with_state(df).state
    df_copy, state_copy = df.clone(), state.clone()
    bad = _later(df).with_columns(df["score"].scatter(5, 1.5))
    with pytest.raises(InputError):
        calpipe.protect_with_state(bad, state=state)
    with pytest.raises(StateError):
        calpipe.protect_with_state(_later(df), state=state, pi=0.9)
    assert_frame_equal(df, df_copy, check_exact=True)
    assert_frame_equal(state, state_copy, check_exact=True)


def test_errors_are_raised_for_a_lazyframe_too():
    with pytest.raises(InputError) as e:
        calpipe.protect(binary_frame(score=-1.0).lazy())
    assert_input_error(e.value, "score", FIRST_BAD, "outside [0, 1]")
