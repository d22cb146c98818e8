"""The ``calpipe`` command.

``calpipe protect`` and ``calpipe methods`` are defined here; the pipeline commands (``demo``,
``run``, ``ui``, ``sql``) register themselves from :mod:`calpipe.cli_pipeline`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from calpipe import metrics
from calpipe.errors import CalpipeError, InputError, ParameterError


def method_params(args: argparse.Namespace) -> dict:
    """Method parameters given on the command line (only the ones the user set)."""
    out: dict = {}
    if args.family is not None:
        out["family"] = args.family
    if args.family_params is not None:
        out["family_params"] = [_parse_param(tok) for tok in args.family_params]
    if args.jumping_rates is not None:
        out["jumping_rates"] = tuple(args.jumping_rates)
    if args.pi is not None:
        out["pi"] = args.pi
    if args.loss is not None:
        out["loss"] = args.loss
    if args.clip is not None:
        out["clip"] = None if args.clip.lower() == "none" else _parse_number("--clip", args.clip)
    for name in _generic_params():
        value = getattr(args, name, None)
        if value is not None:
            out[name] = parse_value(value)
    if args.base_method is not None:
        out["base_method"] = args.base_method
        out["base_params"] = dict(_parse_assignment(tok) for tok in args.base_param or ())
    elif args.base_param:
        raise ParameterError("--base-param given without --base-method")
    return out


#: Options written out by hand above (they need special parsing); every other parameter of every
#: method's table gets a generic ``--name VALUE`` option parsed by :func:`parse_value`.
_SPECIAL = ("family", "family_params", "jumping_rates", "pi", "loss", "clip")


def _generic_params() -> dict[str, str]:
    """Parameter name -> help, over every method's table (first help wins), minus _SPECIAL."""
    from calpipe.calibrators import METHODS

    out: dict[str, str] = {}
    for cls in METHODS.values():
        for name, spec in cls.parameters.items():
            if name not in _SPECIAL and name not in out:
                out[name] = spec.help
    return out


def parse_value(token: str):
    """A command-line value: none -> None, true/false -> bool, integers, numbers, ``a,b,c`` ->
    a tuple of those, anything else a string. The method's table then validates it."""
    low = token.strip().lower()
    if low == "none":
        return None
    if low in ("true", "false"):
        return low == "true"
    if "," in token:
        return tuple(parse_value(t) for t in token.split(",") if t.strip())
    for cast in (int, float):
        try:
            return cast(token)
        except ValueError:
            pass
    return token


def _parse_assignment(token: str) -> tuple[str, object]:
    key, sep, value = token.partition("=")
    if not sep or not key:
        raise ParameterError(f"--base-param {token!r}: expected KEY=VALUE (e.g. window=5000)")
    return key.strip().replace("-", "_"), parse_value(value)


def _parse_number(option: str, token: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParameterError(f"{option}: {token!r} is not a number") from None


def _parse_param(token: str):
    """``0.5`` -> 0.5; ``1,0.5`` -> (1.0, 0.5) (a pair, for cubic and cox2 grids)."""
    parts = [_parse_number("--family-params", x) for x in token.split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)


def _glue_family_params(argv: list[str]) -> list[str]:
    """Turn ``--family-params -1,1 0,2`` into ``--family-params=-1,1 --family-params=0,2``.

    argparse takes a token such as ``-1,1`` for an option, so negative alphas could not be given
    as values; glued with ``=`` each token up to the next ``--option`` is an explicit value.
    """
    out: list[str] = []
    glue = False
    for tok in argv:
        if tok == "--family-params":
            glue = True
        elif glue and not tok.startswith("--"):
            out.append(f"--family-params={tok}")
        else:
            glue = False
            out.append(tok)
    return out


class _Parser(argparse.ArgumentParser):
    """ArgumentParser that accepts negative grid values after ``--family-params``."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(_glue_family_params(args), namespace)


def add_method_options(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that runs a calibrator."""
    g = p.add_argument_group("method")
    g.add_argument("--method", default="composite-jumper",
                   help="composite-jumper (default) or any method `calpipe methods` lists")  # fmt: skip
    g.add_argument("--base-method", metavar="NAME",
                   help="stacking: run NAME first and give its forecasts to --method as the base")  # fmt: skip
    g.add_argument("--base-param", action="append", metavar="KEY=VALUE",
                   help="a parameter of --base-method (repeatable), e.g. window=5000")  # fmt: skip
    g.add_argument("--family", help="cox | cox2 (default) | quadratic | cubic")
    g.add_argument(
        "--family-params", action="extend", nargs="+", metavar="P",
        help="grid of the family: numbers (quadratic eps, cox beta) or a,b pairs (cubic, cox2)",
    )  # fmt: skip
    g.add_argument(
        "--jumping-rates", "--jumping-rate", dest="jumping_rates", type=float, nargs="+",
        metavar="J", help="jumping rate(s) J",
    )  # fmt: skip
    g.add_argument("--pi", type=float, help="passive weight (composite-jumper), default 0.5")
    g.add_argument("--loss", choices=("log", "brier"), help="log (default) or brier compatibility")
    g.add_argument("--clip", help="clip eps of the base probability (log loss), or 'none'")
    for name, help_text in _generic_params().items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="VALUE", help=help_text)


def stream_summary(
    df: pl.DataFrame, *, base: str, protected: str, label: str, by: list[str], multiclass: bool
) -> pl.DataFrame:
    """Per-stream summary: events, labelled, base vs protected log loss / Brier / accuracy,
    final log10 martingale (the last row of each stream in replay order)."""
    mc = multiclass
    aggs = [
        pl.len().alias("events"),
        pl.col(label).is_not_null().sum().alias("labelled"),
        *metrics.base_vs_protected(base, protected, label, multiclass=mc),
        metrics.accuracy(base, label, multiclass=mc).alias("base_accuracy"),
        metrics.accuracy(protected, label, multiclass=mc).alias("protected_accuracy"),
        pl.col("log10_martingale").last().alias("final_log10_martingale"),
    ]
    if by:
        return df.group_by(by, maintain_order=True).agg(aggs).sort(by)
    return df.select(aggs)


def _cmd_protect(args: argparse.Namespace) -> int:
    import calpipe

    t0 = time.perf_counter()
    try:
        events = pl.read_parquet(args.input)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(None, None, f"cannot read {args.input} as Parquet: {exc}") from None
    kw = dict(label=args.label, order_by=tuple(args.order_by), method=args.method)
    kw |= {"scores": args.scores} if args.scores else {"score": args.score}
    if args.by is not None:
        kw["by"] = tuple(args.by)
    if args.label_time:
        kw["label_time"] = args.label_time
    params = method_params(args)
    out = calpipe.protect(events, **kw, **params)
    by = (
        list(args.by) if args.by is not None else (["stream"] if "stream" in events.columns else [])
    )
    multiclass = bool(args.scores)
    if multiclass:
        out = out.with_columns(pl.col(args.scores).cast(pl.List(pl.Float64)))
        out = out.with_columns(pl.col("protected_scores").cast(pl.List(pl.Float64)))
    tmp = Path(args.output).with_suffix(".parquet.tmp")
    out.write_parquet(tmp)
    tmp.replace(args.output)  # atomic: OUTPUT is either complete or untouched
    # Compare with the base as the engine saw it (clipped in log-loss mode), so that
    # base loss - protected loss is the log test martingale the last column reports.
    cal = calpipe.make_calibrator(args.method, **params)
    if "base_method_score" in out.columns:  # a stack bets against its base method's forecasts
        base = "base_method_score"
        out_sum = out
    else:
        raw = out[args.scores].to_list() if multiclass else out[args.score].to_numpy()
        seen = cal.martingale_base(np.asarray(raw, dtype=np.float64))
        base = "base_as_seen"
        out_sum = out.with_columns(pl.Series(base, seen.tolist() if multiclass else seen))
    ordered = out_sum.sort([*by, *args.order_by])
    summary = stream_summary(
        ordered, base=base, protected="protected_scores" if multiclass else "protected_score",
        label=args.label, by=by, multiclass=multiclass,
    )  # fmt: skip
    with pl.Config(tbl_rows=50, tbl_cols=20, float_precision=4, tbl_width_chars=200):
        print(summary)
    print(f"wrote {out.height} rows to {args.output} in {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    import calpipe

    table = calpipe.methods()
    if args.json:
        print(json.dumps(table, indent=2, default=str))
        return 0
    for name, spec in table.items():
        print(f"{name}\n  {spec['summary']}")
        for p, d in spec["parameters"].items():
            print(f"  --{p.replace('_', '-'):<16} default {d['default']!r}; {d['rule']}")
            print(f"  {'':<18} {d['help']}")
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="calpipe",
        description="Protected probabilistic classification as a batch data pipeline.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("protect", help="protect the scores of a Parquet file of scored events")
    p.add_argument("input", help="scored events (Parquet)")
    p.add_argument("output", help="where to write the protected rows (Parquet)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--score", default="score", help="binary base probability column (default: score)"
    )
    src.add_argument("--scores", help="multiclass base probabilities (list column)")
    p.add_argument("--label", default="label")
    p.add_argument("--label-time", help="when each label became known (delayed feedback)")
    p.add_argument("--by", nargs="*", help="stream key columns (default: stream if present)")
    p.add_argument("--order-by", nargs="+", default=["event_time", "event_id"])
    add_method_options(p)
    p.set_defaults(func=_cmd_protect)

    m = sub.add_parser("methods", help="list every method with its parameters and defaults")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_cmd_methods)

    from calpipe import cli_pipeline

    cli_pipeline.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CalpipeError as exc:
        print(f"calpipe: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"calpipe: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
