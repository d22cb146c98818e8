"""Golden tables: every table of four pipeline scenarios as the nightly layer wrote them before
its redesign (issue #32), and the comparison of a rebuild against them.

``make_golden.py`` builds the scenarios and writes ``tests/data/golden/``; ``canonical.py`` is
the canonical form of a table's rows (digests, full rows, the comparison);
``tests/test_golden_tables.py`` rebuilds each scenario with the code under test and compares.
"""
