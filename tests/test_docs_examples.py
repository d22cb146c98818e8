"""Every example of README.md and docs/*.md runs as written and prints what the page shows (#37).

The collector reads the fenced code blocks of each page, in order, and runs them in a folder of
their own (one per page, under a session tmp dir) that holds a copy of one demo database built
once per session (``calpipe demo --db demo.duckdb``, the command the pages start from):

* ``python`` blocks run in one namespace per page, in that folder. A block whose first line is
  a comment naming a file (``# make_feed.py: ...``) is that file: it is written into the
  folder, and a later ``$ python make_feed.py`` runs it.
* ``pycon`` blocks (``>>>`` prompts) are doctests in the page's namespace.
* ``console`` / ``bash`` / ``text`` blocks with ``$ `` prompts are shell sessions: each command
  runs in the folder (``calpipe ...`` through :func:`calpipe.cli.main` in this process, and
  ``python FILE`` through :mod:`runpy`, to spare a process start per command; anything else in
  ``bash``), and what follows it up to the next prompt is its expected output (stdout and
  stderr, as a terminal shows both).
* ``sql`` blocks run through ``calpipe sql --db demo.duckdb`` (DuckDB over the demo database);
  the ``text`` block right after one is its expected output.

Output is compared exactly, after one rule: ``...`` in the expected output matches any text,
as doctest's ELLIPSIS does (including whole elided lines). The pages use it only for what is
truly machine-specific (absolute paths of the folder they ran in, wall times) and for lines
the page elides (marked by a line ``...`` of its own); trailing spaces are ignored.

A block that cannot run here (``make`` targets, ``pip install``, a server such as
``calpipe ui`` or a Spark cluster) carries the marker ``<!-- docs-test: skip: REASON -->``
on the line before its fence, and shows up as a skipped test with that reason. ``text`` blocks
without a prompt and not after a ``sql`` block are pictures of output, not examples.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The command every page's examples start from: the demo database, built once per session.
DEMO_COMMAND = "calpipe demo --db demo.duckdb --no-progress"

FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<info>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S
)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")
FILE_BLOCK = re.compile(r"^# (?P<name>[\w.-]+\.py)(?::|$)")
SHELL = {"console", "bash", "shell", "sh", "text", ""}


@dataclass
class Block:
    page: Path
    line: int
    info: str
    body: str
    skip: str | None = None
    expected: str | None = None  # a sql block's output (the text block after it)
    kind: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Page:
    blocks: list[Block] = field(default_factory=list)


def parse(page: Path) -> list[Block]:
    """The page's example blocks, in order, with their kind, skip reason and expected output."""
    text = page.read_text()
    raw = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        body = "\n".join(
            ln[len(m["indent"]) :] if ln.startswith(m["indent"]) else ln
            for ln in m["body"].splitlines()
        )
        raw.append(Block(page, line, m["info"], body, skip["reason"] if skip else None))
    blocks: list[Block] = []
    consumed = set()
    for i, b in enumerate(raw):
        if i in consumed:
            continue
        if b.info in ("python", "py"):
            b.kind = "file" if FILE_BLOCK.match(b.body) else "python"
        elif b.info == "pycon":
            b.kind = "pycon"
        elif b.info == "sql":
            b.kind = "sql"
            if i + 1 < len(raw) and raw[i + 1].info in ("text", "") and "$ " not in raw[i + 1].body:
                b.expected = raw[i + 1].body
                consumed.add(i + 1)
        elif b.info in SHELL and re.search(r"^\$ ", b.body, re.M):
            b.kind = "console"
        elif b.info in ("bash", "shell", "sh", "console"):
            b.kind = "script"  # commands without prompts or output: must run or be skipped
        else:
            continue  # a picture of output, a file layout, ...
        blocks.append(b)
    return blocks


def _commands(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a shell session; ``\\`` continues a command."""
    out: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("$ "):
            cmd = ln[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append((cmd, []))
        elif out:
            out[-1][1].append(ln)
        i += 1
    return [(c, "\n".join(e)) for c, e in out]


def matches(expected: str, got: str) -> bool:
    """Exact, but ``...`` matches any text (doctest's ELLIPSIS); trailing spaces ignored."""

    def norm(s: str) -> str:
        return "\n".join(ln.rstrip() for ln in s.strip("\n").splitlines())

    checker = doctest.OutputChecker()
    return checker.check_output(norm(expected) + "\n", norm(got) + "\n", doctest.ELLIPSIS)


def run_command(cmd: str, cwd: Path) -> str:
    """Run one command of a page in ``cwd``; its stdout and stderr as a terminal shows them."""
    argv = shlex.split(cmd, comments=True)
    buf = io.StringIO()
    if argv and argv[0] == "calpipe":
        from calpipe.cli import main

        if argv[1:2] in (["demo"], ["sql"], ["report"], ["ui"]) and "--db" not in argv:
            # in a checkout the default database is the repository's .calpipe/demo.duckdb
            return f"calpipe: an example without --db would use the checkout's database: {cmd}"

        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                main(argv[1:])
            except SystemExit:
                pass
        return buf.getvalue()
    if len(argv) == 2 and argv[0] == "python" and argv[1].endswith(".py"):
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_path(str(cwd / argv[1]), run_name="__main__")
        return buf.getvalue()
    proc = subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> tuple[Path, str]:
    """The demo database, built once: the folder and what ``calpipe demo`` printed."""
    folder = tmp_path_factory.mktemp("demo")
    old = Path.cwd()
    os.chdir(folder)
    try:
        printed = run_command(DEMO_COMMAND, folder)
    finally:
        os.chdir(old)
    assert (folder / "demo.duckdb").is_file(), printed
    return folder, printed


_RESULTS: dict[Path, dict[int, str | None]] = {}


def _run_page(page: Path, demo: tuple[Path, str], tmp_root: Path) -> dict[int, str | None]:
    """Run every block of ``page`` in order; per block line, None or what went wrong."""
    if page in _RESULTS:
        return _RESULTS[page]
    folder = tmp_root / page.stem
    folder.mkdir(parents=True)
    shutil.copy(demo[0] / "demo.duckdb", folder / "demo.duckdb")
    shutil.copytree(demo[0] / "landing", folder / "landing")
    namespace: dict = {"__name__": "__docs__"}
    results: dict[int, str | None] = {}
    old = Path.cwd()
    os.chdir(folder)
    try:
        for b in parse(page):
            if b.skip:
                results[b.line] = None
                continue
            try:
                results[b.line] = _run_block(b, folder, namespace, demo[1])
            except Exception as exc:  # reported on the block's own test
                results[b.line] = f"{type(exc).__name__}: {exc}"
    finally:
        os.chdir(old)
    _RESULTS[page] = results
    return results


def _run_block(b: Block, folder: Path, namespace: dict, demo_printed: str) -> str | None:
    if b.kind == "file":
        name = FILE_BLOCK.match(b.body)["name"]  # type: ignore[index]
        (folder / name).write_text(b.body + "\n")
        return None
    if b.kind == "python":
        exec(compile(b.body, b.id, "exec"), namespace)
        return None
    if b.kind == "pycon":
        test = doctest.DocTestParser().get_doctest(b.body, namespace, b.id, str(b.page), b.line)
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        runner = doctest.DocTestRunner(optionflags=flags)
        out = io.StringIO()
        runner.run(test, out=out.write, clear_globs=False)
        namespace.update(test.globs)  # the doctest ran on a copy: later blocks see its names
        return out.getvalue() or None
    if b.kind == "sql":
        got = run_command(f"calpipe sql --db demo.duckdb {shlex.quote(b.body)}", folder)
        if b.expected is not None and not matches(b.expected, got):
            return f"expected:\n{b.expected}\ngot:\n{got}"
        if "calpipe: error" in got:
            return got
        return None
    if b.kind == "console":
        for cmd, expected in _commands(b.body):
            got = demo_printed if cmd == DEMO_COMMAND else run_command(cmd, folder)
            if not matches(expected, got):
                return f"$ {cmd}\nexpected:\n{expected}\ngot:\n{got}"
        return None
    return "a shell block without prompts: give its commands `$ ` prompts or a skip marker"


BLOCKS = [b for page in PAGES for b in parse(page)]


def test_the_pages_have_examples():
    """The collector finds the README's examples of each kind (a broken fence pattern would
    make every other test here vanish silently)."""
    readme = {b.kind for b in BLOCKS if b.page.name == "README.md"}
    assert {"pycon", "console", "sql"} <= readme, readme
    everywhere = {b.kind for b in BLOCKS}
    assert {"python", "file", "pycon", "console", "sql"} <= everywhere, everywhere


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example(block: Block, demo_dir, tmp_path_factory):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    root = tmp_path_factory.getbasetemp() / "pages"
    result = _run_page(block.page, demo_dir, root)[block.line]
    assert result is None, f"{block.id} ({block.kind}):\n{result}"


if __name__ == "__main__":  # list the blocks: python tests/test_docs_examples.py
    for b in BLOCKS:
        print(b.id, b.kind, f"skip: {b.skip}" if b.skip else "", file=sys.stdout)
