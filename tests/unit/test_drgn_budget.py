"""Issue 47 (round four), Low 10: a ``drgn:`` check's bytes are budgeted, not only its steps. A real
drgn Program over a memory segment of 1 GiB, and an object of 60 MiB in it: 25 reads of it held
1.85 GB in labctl before."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

drgn = pytest.importorskip("drgn")

from labctl.inspect.evaluate import MAX_BYTES, ExprError, evaluate


def _walk(text: str, size: int) -> Any:
    """``text`` evaluated where ``prog.object('big')`` is a char array of ``size`` bytes."""
    prog = drgn.Program(drgn.host_platform)
    prog.add_memory_segment(0x1000, 1 << 30, lambda addr, n, off, phys: bytes(n))
    big = drgn.Object(prog, prog.array_type(prog.int_type("char", 1, True), size), address=0x1000)
    prog.add_object_finder(lambda p, name, flags, filename: big if name == "big" else None)
    return evaluate(prog, text)


def test_reads_past_the_byte_budget_are_refused_before_they_are_made() -> None:
    assert _walk("len(prog.object('big').to_bytes_()) == 4096", 4096) is True
    tracemalloc.start()
    try:
        with pytest.raises(ExprError, match=f"more than {MAX_BYTES >> 20} MiB read or made"):
            _walk("[len(prog.object('big').to_bytes_()) for i in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]", 60 << 20)
        with pytest.raises(ExprError, match="MiB read or made"):
            _walk("len(prog.object('big').to_bytes_())", 512 << 20)  # one read over the budget: never made
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * (60 << 20), peak
