"""An out-of-tree module is built again only when something its last build read changed
(the .cmd files kbuild writes are fakes here; tests/integration/test_kernels.py builds
the real one against the suite's tree)."""

from __future__ import annotations

import os
from pathlib import Path

from labctl.kernel import modbuild

CMD = """\
cmd_{src}/m.o := gcc -Wp,-MMD,{src}/.m.o.d -nostdinc -I./include -c -o {src}/m.o {src}/m.c

source_{src}/m.o := {src}/m.c

deps_{src}/m.o := \\
  include/linux/compiler-version.h \\
    $(wildcard include/config/CC_VERSION_TEXT) \\
  include/linux/module.h \\
  {abs_header} \\

{src}/m.o: $(deps_{src}/m.o)

$(deps_{src}/m.o):
"""


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    build, src, other = tmp_path / "linux", tmp_path / "mod", tmp_path / "elsewhere"
    for d in (build / "include" / "linux", src, other):
        d.mkdir(parents=True)
    for f in ("include/linux/compiler-version.h", "include/linux/module.h", "Module.symvers", ".config"):
        (build / f).write_text("x\n")
    (other / "extra.h").write_text("y\n")
    (src / "m.c").write_text("int x;\n")
    (src / "m.ko").write_bytes(b"\x7fELF")
    (src / ".m.o.cmd").write_text(CMD.format(src=src, abs_header=other / "extra.h"))
    return build, src, other


def _touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_nothing_changed_means_no_build(tmp_path: Path) -> None:
    build, src, _ = _tree(tmp_path)
    assert not modbuild.unchanged(src, build)  # never recorded
    modbuild.record(src, build)
    assert modbuild.unchanged(src, build)
    assert not modbuild.unchanged(src, tmp_path / "another-tree")


def test_a_header_it_read_the_symbols_or_the_config_changed_means_a_build(tmp_path: Path) -> None:
    for changed in ("include/linux/module.h", "Module.symvers", ".config", "SRC/m.c", "ABS"):
        build, src, other = _tree(tmp_path / changed.replace("/", "_"))
        modbuild.record(src, build)
        path = {"SRC/m.c": src / "m.c", "ABS": other / "extra.h"}.get(changed, build / changed)
        _touch(path)
        assert modbuild.unchanged(src, build), changed  # touched only: the same bytes
        path.write_text("changed\n")
        assert not modbuild.unchanged(src, build), changed


def test_a_config_guard_that_appears_means_a_build(tmp_path: Path) -> None:
    build, src, _ = _tree(tmp_path)
    modbuild.record(src, build)
    (build / "include" / "config").mkdir()
    (build / "include" / "config" / "CC_VERSION_TEXT").write_text("")
    assert not modbuild.unchanged(src, build)


def test_a_missing_module_means_a_build(tmp_path: Path) -> None:
    build, src, _ = _tree(tmp_path)
    modbuild.record(src, build)
    (src / "m.ko").unlink()
    assert not modbuild.unchanged(src, build)


def test_a_file_rewritten_with_the_same_bytes_is_unchanged(tmp_path: Path) -> None:
    """The tree's own build rewrites Module.symvers on every `make modules`."""
    build, src, _ = _tree(tmp_path)
    modbuild.record(src, build)
    (build / "Module.symvers").write_text("x\n")
    _touch(build / "Module.symvers")
    assert modbuild.unchanged(src, build)
    (build / "Module.symvers").write_text("z\n")  # same size, other symbols
    assert not modbuild.unchanged(src, build)
