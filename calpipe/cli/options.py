"""The method options every command that runs a calibrator shares, and their parsing.

``--method``, ``--base-method``/``--base-param``, the options of the protected methods that need
their own parsing (``--family``, ``--family-params``, ...), and one generic ``--name VALUE``
option per other parameter of any method's table (:data:`calpipe.calibrators.METHODS`), so that
every parameter ``calpipe methods`` lists can be given on the command line.
"""

from __future__ import annotations

import argparse
import sys

from calpipe import config
from calpipe.calibrators import METHODS
from calpipe.errors import ParameterError

#: Options written out by hand below (they need special parsing); every other parameter of every
#: method's table gets a generic ``--name VALUE`` option parsed by :func:`parse_value`.
_SPECIAL = ("family", "family_params", "jumping_rates", "pi", "loss", "clip")


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


def _generic_params() -> dict[str, str]:
    """Parameter name -> help, over every method's table (first help wins), minus _SPECIAL."""
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


class Parser(argparse.ArgumentParser):
    """ArgumentParser that accepts negative grid values after ``--family-params``."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(_glue_family_params(args), namespace)


def add_method_options(
    p: argparse.ArgumentParser, default_method: str = config.DEFAULT_METHOD
) -> None:
    """Options shared by every command that runs a calibrator (``calpipe run`` defaults to
    :data:`calpipe.config.PIPELINE_DEFAULT_METHOD`, the others to ``DEFAULT_METHOD``)."""
    g = p.add_argument_group("method")
    g.add_argument("--method", default=default_method,
                   help=f"{default_method} (default) or any method `calpipe methods` lists")  # fmt: skip
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
    g.add_argument(
        "--pi", type=float, help="passive weight (composite-jumper, composite-experts), default 0.5"
    )
    g.add_argument("--loss", choices=("log", "brier"), help="log (default) or brier compatibility")
    g.add_argument("--clip", help="clip eps of the base probability (log loss), or 'none'")
    for name, help_text in _generic_params().items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="VALUE", help=help_text)
