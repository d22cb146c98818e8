"""calpipe.cli.options: the method options of ``calpipe protect`` and ``calpipe run`` accept
every parameter ``calpipe methods`` lists, negative grid values, and values the tables validate."""

from __future__ import annotations

import calpipe
from calpipe.cli import build_parser, parse_value


def test_every_option_methods_prints_is_accepted_by_protect():
    """`calpipe methods` advertises each parameter as --option: protect must accept it."""
    parser = build_parser()
    values = {
        "family": ["cox"],
        "family-params": ["1", "0.5"],
        "jumping-rates": ["1", "0.1"],
        "pi": ["0.3"],
        "loss": ["log"],
        "clip": ["0.01"],
    }
    for spec in calpipe.methods().values():
        for p in spec["parameters"]:
            opt = p.replace("_", "-")
            args = parser.parse_args(
                ["protect", "in.parquet", "out.parquet", f"--{opt}", *values.get(opt, ["1"])]
            )
            assert getattr(args, p) is not None


def test_family_params_pair_with_a_negative_alpha_is_accepted():
    """The default Cox grid has alpha = -1 (docs/ARCHITECTURE.md §4), so `--family-params 0,1 1,1 -1,1` must
    parse; argparse took "-1,1" for an unknown option and exited with a usage error."""
    args = build_parser().parse_args(
        ["protect", "in.parquet", "out.parquet", "--family-params", "0,1", "1,1", "-1,1"]
    )
    assert args.family_params == ["0,1", "1,1", "-1,1"]


def test_generic_values_parse_to_what_the_tables_validate():
    assert [parse_value(t) for t in ("none", "True", "5", "0.25", "1,2.5", "abm")] == [
        None, True, 5, 0.25, (1, 2.5), "abm",
    ]  # fmt: skip


def test_inputs_of_the_default_parse_to_the_specs_it_validates():
    """--inputs ops,beta:window=500:refit_every=100 gives composite-experts those two inputs."""
    from calpipe.calibrators import make_calibrator
    from calpipe.cli.options import method_params

    args = build_parser().parse_args(
        ["protect", "in.parquet", "out.parquet", "--inputs", "ops,beta:window=500:refit_every=100"]
    )
    cal = make_calibrator("composite-experts", **method_params(args))
    assert cal.params["inputs"] == (("ops", ()), ("beta", (("refit_every", 100), ("window", 500))))
