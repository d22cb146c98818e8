"""MkDocs hook: render every method's parameter table from the code.

The tables come from :func:`calpipe.methods`, which reads each calibrator's ``parameters``
(the same :class:`calpipe.calibrators._params.Param` table that validates them and that
``calpipe methods`` prints), so the site cannot drift from the code. A page asks for them with
the line ``<!-- calpipe:methods-table -->``.
"""

from __future__ import annotations

MARKER = "<!-- calpipe:methods-table -->"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """Markdown: one section per method, its summary and a table of its parameters."""
    import calpipe

    out = []
    for name, spec in calpipe.methods().items():
        out += [f"### `{name}`", "", _cell(spec["summary"]), ""]
        if not spec["parameters"]:
            out += ["No parameters.", ""]
            continue
        out += ["| parameter | option | default | rule | what |", "|---|---|---|---|---|"]
        for p, d in spec["parameters"].items():
            option = "--" + p.replace("_", "-")
            out.append(
                f"| `{p}` | `{option}` | `{d['default']!r}` | {_cell(d['rule'])} | {_cell(d['help'])} |"
            )
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render())
    return markdown
