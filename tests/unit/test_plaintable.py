"""The quick commands' tables without rich (labctl.cli.plaintable): byte for byte what rich prints for a
pipe, on many tables; None wherever rich would draw something else (wrap, wide characters, breaks)."""

from __future__ import annotations

import io
import random
import string

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labctl.cli import plaintable


def by_rich(title: str, columns: list[str], rows: list[list[str]], width: int = plaintable.WIDTH) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, highlight=False, markup=False)
    t = Table(title=Text(title), title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    console.print(t)
    return buf.getvalue()


def _word(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + " .:/-_@[]()") for _ in range(rng.randint(0, most)))


def test_every_table_it_draws_is_richs_own() -> None:
    rng = random.Random(7)
    drawn = refused = 0
    for _ in range(400):
        ncols = rng.randint(1, 10)
        columns = [_word(rng, 8) or "c" for _ in range(ncols)]
        rows = [[_word(rng, 25) for _ in range(ncols)] for _ in range(rng.randint(1, 4))]
        title = rng.choice(["", "lab x · kernel 6.1.0-56-amd64", _word(rng, 200)])
        mine = plaintable.render(title, columns, rows)
        if mine is None:
            refused += 1
            continue
        drawn += 1
        assert mine == by_rich(title, columns, rows), (title, columns, rows)
    assert drawn > 200 and refused > 20  # both sides of the width limit were tried


@pytest.mark.parametrize("cell", ["wide 名前", "two\nlines", "tab\there", "e\u0301"])
def test_what_only_rich_can_draw_is_left_to_it(cell: str) -> None:
    assert plaintable.render("t", ["a", "b"], [["x", cell]]) is None


def test_a_table_wider_than_the_console_or_a_title_wider_than_the_table_is_left_to_rich() -> None:
    row = ["x" * 70, "y" * 70]
    assert plaintable.render("t", ["a", "b"], [row]) == by_rich("t", ["a", "b"], [row])  # 151 columns: fits
    assert plaintable.render("t", ["a", "b"], [["x" * 80, "y" * 80]]) is None
    assert plaintable.render("t" * 20, ["a"], [["b"]]) is None


def test_only_a_pipe_or_a_file_without_a_forced_terminal_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert plaintable.plain_stdout()
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not plaintable.plain_stdout()
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert not plaintable.plain_stdout()
