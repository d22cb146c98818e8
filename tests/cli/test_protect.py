"""The ``calpipe`` command: ``protect`` on Parquet files (binary and ``--scores`` multiclass), its
printed per-stream summary, its errors (exit code 2, message on stderr, OUTPUT untouched) and
``methods``."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import calpipe
from calpipe.cli import main, stream_summary
from tests.conftest import make_events

SUMMARY_COLUMNS = [
    "events",
    "labelled",
    "base_log_loss",
    "protected_log_loss",
    "base_brier",
    "protected_brier",
    "base_accuracy",
    "protected_accuracy",
    "final_log10_martingale",
]


def parse_table(text: str) -> pl.DataFrame:
    """The first polars table printed in ``text`` back into a frame (cells as strings)."""
    lines = [ln for ln in text.splitlines() if "┆" in ln or "╞" in ln]
    header = [c.strip(" │") for c in lines[0].split("┆")]
    start = next(i for i, ln in enumerate(lines) if "╞" in ln) + 1
    rows = [[c.strip(" │") for c in ln.split("┆")] for ln in lines[start:]]
    return pl.DataFrame(rows, schema=header, orient="row")


def expected_summary(df: pl.DataFrame, k: int, eps: float | None = 1e-3) -> dict[str, dict]:
    """Per stream, the summary computed with plain numpy from the input and the output rows."""
    out: dict[str, dict] = {}
    by = "stream" in df.columns
    for key, part in df.group_by("stream") if by else [((None,), df)]:
        part = part.sort("event_time", "event_id")
        y = part["label"].to_numpy().astype(float)
        lab = ~np.isnan(y)
        yi = y[lab].astype(int)
        if k == 2:
            p = part["score"].to_numpy()
            p = np.clip(p, eps, 1 - eps) if eps else p
            q = part["protected_score"].to_numpy()
            P = np.column_stack([1 - p, p])[lab]
            Q = np.column_stack([1 - q, q])[lab]
        else:
            p = np.array(part["scores"].to_list())
            if eps:
                p = np.maximum(p, eps)
                p = p / p.sum(axis=1, keepdims=True)
            P = p[lab]
            Q = np.array(part["protected_scores"].to_list())[lab]
        onehot = np.eye(k)[yi]
        row = {"events": part.height, "labelled": int(lab.sum())}
        for name, X in (("base", P), ("protected", Q)):
            row[f"{name}_log_loss"] = float(np.mean(-np.log(X[np.arange(len(yi)), yi])))
            if k == 2:  # binary Brier is (p - y)^2 on the probability of label 1
                row[f"{name}_brier"] = float(np.mean((X[:, 1] - yi) ** 2))
            else:
                row[f"{name}_brier"] = float(np.mean(((X - onehot) ** 2).sum(axis=1)))
            if k == 2:
                hit = (X[:, 1] >= 0.5).astype(int) == yi
            else:
                hit = X.argmax(axis=1) == yi
            row[f"{name}_accuracy"] = float(np.mean(hit))
        row["final_log10_martingale"] = float(part["log10_martingale"][-1])
        out[key[0]] = row
    return out


def check_printed_summary(text: str, expected: dict[str, dict]) -> None:
    table = parse_table(text)
    assert [c for c in table.columns if c != "stream"] == SUMMARY_COLUMNS
    assert table.height == len(expected)
    for row in table.iter_rows(named=True):
        exp = expected[row.get("stream")]
        for col in SUMMARY_COLUMNS:
            assert float(row[col]) == pytest.approx(exp[col], abs=6e-5), col


@pytest.fixture
def binary_file(tmp_path):
    df = make_events(21, n_events=80, n_streams=2, null_frac=0.25)
    path = tmp_path / "events.parquet"
    df.write_parquet(path)
    return df, path


@pytest.fixture
def multiclass_file(tmp_path):
    df = make_events(22, n_events=60, n_streams=2, n_classes=3, null_frac=0.25)
    path = tmp_path / "mc.parquet"
    df.write_parquet(path)
    return df, path


# ----------------------------------------------------------------------------------------------
# protect
# ----------------------------------------------------------------------------------------------
def test_protect_binary_writes_the_protected_rows_and_prints_the_summary(
    binary_file, tmp_path, capsys
):
    df, path = binary_file
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path)]) == 0
    out = pl.read_parquet(out_path)
    assert out.columns == [*df.columns, "protected_score", "log10_martingale"]
    assert_frame_equal(out, calpipe.protect(df), check_exact=True)
    text = capsys.readouterr().out
    check_printed_summary(text, expected_summary(out, 2))
    assert f"wrote {df.height} rows to {out_path}" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet", "out.parquet"]


def test_protect_multiclass_scores(multiclass_file, tmp_path, capsys):
    df, path = multiclass_file
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path), "--scores", "scores"]) == 0
    out = pl.read_parquet(out_path)
    assert out.columns == [*df.columns, "protected_scores", "log10_martingale"]
    assert out.schema["protected_scores"] == pl.List(pl.Float64)
    assert_frame_equal(out, calpipe.protect(df, scores="scores"), check_exact=True)
    check_printed_summary(capsys.readouterr().out, expected_summary(out, 3))


def test_protect_with_method_options(binary_file, tmp_path, capsys):
    df, path = binary_file
    out_path = tmp_path / "out.parquet"
    argv = ["protect", str(path), str(out_path), "--method", "jumper"]
    argv += ["--family", "cox2", "--family-params", "0,1", "1,1", "0.5,2", "--jumping-rates", "0.1"]
    argv += ["--clip", "0.01"]
    assert main(argv) == 0
    expected = calpipe.protect(
        df,
        method="jumper",
        family="cox2",
        family_params=[(0.0, 1.0), (1.0, 1.0), (0.5, 2.0)],
        jumping_rates=[0.1],
        clip=0.01,
    )
    assert_frame_equal(pl.read_parquet(out_path), expected, check_exact=True)
    check_printed_summary(capsys.readouterr().out, expected_summary(expected, 2, eps=0.01))


def test_protect_brier_compatibility_mode(binary_file, tmp_path, capsys):
    df, path = binary_file
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path), "--method", "composite-jumper", "--loss", "brier",
                 "--pi", "0.4"]) == 0  # fmt: skip
    out = pl.read_parquet(out_path)
    assert_frame_equal(
        out, calpipe.protect(df, method="composite-jumper", loss="brier", pi=0.4), check_exact=True
    )
    assert "log10_martingale_by_rate" in out.columns
    check_printed_summary(capsys.readouterr().out, expected_summary(out, 2, eps=None))


def test_protect_identity_family_leaves_the_clipped_base(binary_file, tmp_path):
    df, path = binary_file
    out_path = tmp_path / "out.parquet"
    argv = ["protect", str(path), str(out_path), "--method", "mean-jumper"]
    assert main([*argv, "--family", "quadratic", "--family-params", "0"]) == 0
    out = pl.read_parquet(out_path)
    base = np.clip(df["score"].to_numpy(), 1e-3, 1 - 1e-3)
    np.testing.assert_allclose(out["protected_score"].to_numpy(), base, rtol=0, atol=4e-16)


def test_protect_with_label_time(tmp_path, capsys):
    df = make_events(23, n_events=50, n_streams=2, label_time=True)
    path, out_path = tmp_path / "in.parquet", tmp_path / "out.parquet"
    df.write_parquet(path)
    assert main(["protect", str(path), str(out_path), "--label-time", "label_time"]) == 0
    out = pl.read_parquet(out_path)
    assert_frame_equal(out, calpipe.protect(df, label_time="label_time"), check_exact=True)
    check_printed_summary(capsys.readouterr().out, expected_summary(out, 2))


def test_protect_by_nothing_runs_one_stream(tmp_path, capsys):
    df = make_events(25, n_events=30, n_streams=1)  # a 'stream' column, used as data only
    path, out_path = tmp_path / "in.parquet", tmp_path / "out.parquet"
    df.write_parquet(path)
    assert main(["protect", str(path), str(out_path), "--by"]) == 0
    out = pl.read_parquet(out_path)
    assert_frame_equal(out, calpipe.protect(df, by=()), check_exact=True)
    text = capsys.readouterr().out
    assert "stream" not in parse_table(text).columns
    check_printed_summary(text, expected_summary(out.drop("stream"), 2))


def test_summary_log_loss_gap_is_the_final_log_martingale(binary_file):
    """base loss - protected loss (on the clipped base) x labelled = ln 10 x log10 martingale."""
    df, _ = binary_file
    out = calpipe.protect(df).with_columns(
        pl.col("score").clip(1e-3, 1 - 1e-3).alias("base_as_seen")
    )
    summary = stream_summary(
        out.sort("stream", "event_time", "event_id"),
        base="base_as_seen",
        protected="protected_score",
        label="label",
        by=["stream"],
        multiclass=False,
    )
    for row in summary.iter_rows(named=True):
        gap = (row["base_log_loss"] - row["protected_log_loss"]) * row["labelled"]
        assert gap == pytest.approx(math.log(10) * row["final_log10_martingale"], abs=1e-10)


# ----------------------------------------------------------------------------------------------
# Errors: exit code 2, message on stderr, OUTPUT not created or changed
# ----------------------------------------------------------------------------------------------
def _bad_input(tmp_path):
    df = make_events(24, n_events=20)
    df = df.with_columns(df["score"].scatter(7, 1.5))
    path = tmp_path / "bad.parquet"
    df.write_parquet(path)
    return path


@pytest.mark.parametrize("existing", [False, True])
def test_bad_input_exits_2_and_leaves_output_untouched(tmp_path, capsys, existing):
    path = _bad_input(tmp_path)
    out_path = tmp_path / "out.parquet"
    if existing:
        out_path.write_bytes(b"previous output")
    assert main(["protect", str(path), str(out_path)]) == 2
    err = capsys.readouterr().err
    assert "calpipe: error:" in err and "column 'score', row 7" in err and "[0, 1]" in err
    if existing:
        assert out_path.read_bytes() == b"previous output"
    else:
        assert not out_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["bad.parquet"] + (["out.parquet"] if existing else [])
    )


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--pi", "0"], ["pi=0.0", "(0, 1)"]),
        (["--method", "vennabers"], ["unknown method 'vennabers'"]),
        (["--method", "platt", "--window", "0"], ["window=0", "an integer >= 1"]),
        (["--window", "5"], ["unknown parameter(s) 'window'", "composite-experts"]),
        (["--jumping-rates", "1.5"], ["jumping_rates", "(0, 1]"]),
        (["--family", "cox", "--family-params", "x"], ["--family-params", "'x'"]),
        (["--method", "composite-jumper", "--loss", "brier", "--clip", "0.01"], ["clip", "brier"]),
        (["--label", "outcome"], ["column 'outcome'", "missing column"]),
        (["--by", "segment"], ["column 'segment'", "missing column"]),
    ],
)
def test_bad_parameters_exit_2_and_write_nothing(binary_file, tmp_path, capsys, extra, words):
    _, path = binary_file
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("calpipe: error:")
    for w in words:
        assert w in err
    assert not out_path.exists()


def test_missing_input_file_exits_2(tmp_path, capsys):
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(tmp_path / "nope.parquet"), str(out_path)]) == 2
    assert "nope.parquet" in capsys.readouterr().err
    assert not out_path.exists()


def test_input_that_is_not_parquet_exits_2_with_a_message(tmp_path, capsys):
    """A corrupt/non-Parquet INPUT is bad input: exit 2 and a one-line error, not a traceback."""
    path = tmp_path / "events.parquet"
    path.write_text("event_time,event_id,score,label\n1,1,0.5,1\n")
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path)]) == 2
    assert "calpipe: error:" in capsys.readouterr().err
    assert not out_path.exists()


def test_protect_reads_csv_as_calpipe_run_does(binary_file, tmp_path, capsys):
    """``calpipe protect`` reads CSV too (issue 37 item 9), typed by DuckDB's sniffer as
    ``calpipe run`` reads it: the same protected rows as from the Parquet file."""
    df, _ = binary_file
    for name in ("events.csv", "events.csv.gz"):
        csv = tmp_path / name
        if name.endswith(".gz"):
            import gzip

            csv.write_bytes(gzip.compress(df.write_csv().encode()))
        else:
            df.write_csv(csv)
        out_path = tmp_path / f"out-{name}.parquet"
        assert main(["protect", str(csv), str(out_path)]) == 0
        out = pl.read_parquet(out_path)
        want = calpipe.protect(df)
        assert out.height == want.height
        assert_frame_equal(out.select(want.columns), want, check_dtypes=False, check_exact=True)
    assert f"wrote {df.height} rows" in capsys.readouterr().out


def test_csv_input_that_cannot_be_read_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    assert main(["protect", str(missing), str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "nope.csv" in err
    assert not (tmp_path / "o.parquet").exists()
    bad = tmp_path / "bad.csv.gz"  # not gzip
    bad.write_text("stream,event_id,score\na,1,0.5\n")
    assert main(["protect", str(bad), str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "bad.csv.gz" in err
    assert not (tmp_path / "o.parquet").exists()


def test_clip_that_is_not_a_number_exits_2_with_a_message(binary_file, tmp_path, capsys):
    """``--clip abc`` is a bad parameter like ``--pi 0``: exit 2, message, no traceback."""
    _, path = binary_file
    out_path = tmp_path / "out.parquet"
    assert main(["protect", str(path), str(out_path), "--clip", "abc"]) == 2
    err = capsys.readouterr().err
    assert "calpipe: error:" in err and "clip" in err
    assert not out_path.exists()


def test_unknown_option_is_a_usage_error(binary_file, tmp_path, capsys):
    _, path = binary_file
    with pytest.raises(SystemExit) as e:
        main(["protect", str(path), str(tmp_path / "out.parquet"), "--alpha", "1"])
    assert e.value.code == 2
    assert "--alpha" in capsys.readouterr().err
    assert not (tmp_path / "out.parquet").exists()


# ----------------------------------------------------------------------------------------------
# methods
# ----------------------------------------------------------------------------------------------
def test_methods_lists_every_method_and_parameter(capsys):
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    for name, spec in calpipe.methods().items():
        assert f"{name}\n  {spec['summary']}" in text
        # "\n" before the name: "ops" is also the end of "hops" and of a rule's "ops, obs"
        block = f"\n{text}".split(f"\n{name}\n", 1)[1].split("\n\n", 1)[0]
        for p, d in spec["parameters"].items():
            assert f"--{p.replace('_', '-')}" in block
            assert d["rule"] in block


def test_methods_json_is_the_methods_table(capsys):
    assert main(["methods", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table == json.loads(json.dumps(calpipe.methods(), default=str))
    assert set(table) == set(calpipe.calibrators.METHODS)
    assert {"jumper", "mean-jumper", "composite-jumper", "platt"} <= set(table)


def test_protect_runs_a_batch_method_and_a_stack(tmp_path, capsys):
    from tests.conftest import make_events

    src = tmp_path / "in.parquet"
    make_events(4, n_events=200).write_parquet(src)
    out = tmp_path / "out.parquet"
    argv = ["protect", str(src), str(out), "--method", "platt", "--window", "20",
            "--refit-every", "10"]  # fmt: skip
    assert main(argv) == 0
    got = pl.read_parquet(out)
    want = calpipe.protect(pl.read_parquet(src), method="platt", window=20, refit_every=10)
    assert got["protected_score"].to_list() == want["protected_score"].to_list()
    argv = ["protect", str(src), str(out), "--base-method", "platt", "--base-param", "window=20"]
    assert main(argv) == 0
    assert "base_method_score" in pl.read_parquet(out).columns
    assert main([*argv, "--base-param", "windo=3"]) == 2
    assert "unknown parameter(s) 'windo'" in capsys.readouterr().err


def test_a_directory_as_output_was_a_traceback_after_the_work(binary_file, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert main(["protect", str(binary_file), str(tmp_path / "out")]) == 2
    assert "is a directory; name a Parquet file" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []


def test_protect_two_class_scores_wrote_nan_rows_with_exit_0(binary_file, tmp_path, capsys):
    """issue 36 item 3: --scores with [p0, p1] vectors wrote NaN rows and exited 0; they are
    the binary p1 (docs/ARCHITECTURE.md §3): the binary run's forecasts as [1 - p', p']."""
    df, _ = binary_file
    vec = df.with_columns(pl.concat_list(1.0 - pl.col("score"), pl.col("score")).alias("scores"))
    vec = vec.with_columns(pl.col("scores").list.get(1).alias("score"))
    path, out_path = tmp_path / "two.parquet", tmp_path / "out.parquet"
    vec.drop("score").write_parquet(path)
    assert main(["protect", str(path), str(out_path), "--scores", "scores"]) == 0
    got = pl.read_parquet(out_path)["protected_scores"].to_list()
    want = calpipe.protect(vec.drop("scores"))["protected_score"].to_list()
    assert got == [[1.0 - p, p] for p in want]
    assert "nan" not in capsys.readouterr().out.lower()
