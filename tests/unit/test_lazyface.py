"""labctl.lazyface: a face's names are read from its ``if TYPE_CHECKING:`` imports and loaded at their
first use, to the very objects their modules define."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labctl.lazyface import lazy_names

ROOT = Path(__file__).resolve().parents[2]

FACE = '''
from typing import TYPE_CHECKING
import os
from pkg.kept import eager

if TYPE_CHECKING:
    from pkg.a import one, two as deux
    from .b import three
    from . import sub
    import pkg.c
else:
    __getattr__, __dir__ = attach(__name__, __file__, globals())
'''


def test_names_come_from_the_type_checking_imports_only() -> None:
    assert lazy_names(FACE, "pkg") == {"one": ("pkg.a", "one"), "deux": ("pkg.a", "two"),
                                       "three": ("pkg.b", "three"), "sub": ("pkg", "sub")}


def test_a_star_import_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hand on"):
        lazy_names("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import *\n", "pkg")


def test_every_lazy_face_hands_on_the_objects_its_modules_define() -> None:
    """Each name of each lazy face, looked up through the face, is its module's own object, and a
    name the face does not list is an AttributeError (never a module of the same name by chance).
    No lazy name is also a submodule's: importing that submodule sets it on the package, and the
    name would then be the module (``labctl.training``'s ``reset`` was, for a while)."""
    code = (
        "import importlib, labctl.lazyface as lf, pathlib, pkgutil\n"
        "for face in ('labctl.lab', 'labctl.backends', 'labctl.kernel', 'labctl.state', 'labctl.up', 'labctl.training'):\n"
        "    pkg = importlib.import_module(face)\n"
        "    names = lf.lazy_names(pathlib.Path(pkg.__file__).read_text(), face)\n"
        "    assert names, face\n"
        "    subs = {m.name for m in pkgutil.iter_modules(pkg.__path__)}\n"
        "    clash = sorted(n for n, (mod, attr) in names.items() if mod != face and n in subs)\n"
        "    assert not clash, (face, clash)\n"
        "    assert set(names) <= set(pkg.__all__), (face, set(names) - set(pkg.__all__))\n"
        "    for name, (mod, attr) in names.items():\n"
        "        want = importlib.import_module(mod + '.' + attr) if mod == face else getattr(importlib.import_module(mod), attr)\n"
        "        assert getattr(pkg, name) is want, (face, name)\n"
        "    assert set(dir(pkg)) >= set(pkg.__all__), face\n"
        "    try:\n"
        "        getattr(pkg, 'no_such_name')\n"
        "    except AttributeError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(face)\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_a_name_is_loaded_at_its_first_use_and_not_before() -> None:
    code = ("import sys, labctl.lab\n"
            "assert 'labctl.lab.load' not in sys.modules\n"
            "from labctl.lab import load_lab\n"
            "assert 'labctl.lab.load' in sys.modules and load_lab.__module__ == 'labctl.lab.load'\n"
            "assert labctl.lab.__dict__['load_lab'] is load_lab\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
