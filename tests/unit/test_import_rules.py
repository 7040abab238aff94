"""The pipeline's shape, checked on the source (each rule with a test that feeds it a break).

* each stage package's docstring says what it never imports, in lines ``Imports never: labctl.x,
  labctl.y`` (any number of them, anywhere in the docstring; a line that mentions the rule any other
  way fails, as it would go unread), and no module of the package does,
  however the import is written: ``import x``, ``from x import y``, relative, inside a function,
  under ``TYPE_CHECKING``, or through ``importlib.import_module``/``__import__`` (a dynamic
  import the walk cannot read is refused);
* no package imports one that imports it back, through any number of others (top-level modules
  such as :mod:`labctl.pipeline` count as packages of their own);
* only :mod:`labctl.proc` runs host processes (``subprocess``, ``os.exec*``, ``os.system``,
  ``os.popen``, ``os.spawn*``, ``pty``, asyncio's ``create_subprocess_*``);
* the CLI never sequences the front of the pipeline itself;
* no two modules share a name, and no module is named like a package (``kernel/lab.py`` beside ``lab/``).
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import labctl

ROOT = Path(labctl.__file__).resolve().parent
RULE = "Imports never:"
# Packages that may import anything: the CLI sits on top of every stage.
UNRULED = {"labctl.cli"}
PROCESS_MODULES = ("subprocess", "pty", "multiprocessing")
PROCESS_CALLS = {"system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
                 "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
                 "posix_spawn", "posix_spawnp", "fork", "forkpty"}
PROCESS_HOME = "labctl.proc"
# asyncio starts processes without importing subprocess (asyncio.create_subprocess_exec, loop.subprocess_exec)
ASYNC_PROCESS_CALLS = {"create_subprocess_exec", "create_subprocess_shell", "subprocess_exec", "subprocess_shell"}


def module_name(path: Path, root: Path | None = None) -> str:
    root = root or ROOT
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Import:
    """One module a source file imports: its absolute name, the line, and the names taken from it."""

    target: str
    line: int
    names: tuple[str, ...] = ()
    dynamic: bool = False  # importlib.import_module / __import__


def _absolute(package: str, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    base = package.split(".")
    base = base[:len(base) - level + 1]
    return ".".join(base + ([module] if module else []))


def _dynamic(node: ast.Call, importers: set[str]) -> str | None:
    """The module name of ``importlib.import_module("x")`` or ``__import__("x")`` (``importers``: the
    names they go by in the file); "?" when it is not a literal (the walk cannot tell what it
    imports); None for any other call."""
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name not in importers:
        return None
    arg = node.args[0] if node.args else None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "?"


def imports_in(tree: ast.AST, module: str, is_package: bool) -> list[Import]:
    """Every module ``tree`` imports, wherever the import sits (functions, TYPE_CHECKING blocks)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    importers = {"import_module", "__import__"} | {a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                                                  for a in node.names if a.name == "import_module" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(package, node.level, node.module)
            # ``from labctl.x import y`` may import the module labctl.x.y
            found.append(Import(target, node.lineno, tuple(a.name for a in node.names)))
            found += [Import(f"{target}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Call) and (target := _dynamic(node, importers)) is not None:
            found.append(Import(target, node.lineno, dynamic=True))
    return found


@dataclass(frozen=True)
class Source:
    path: Path
    module: str
    tree: ast.Module

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(ROOT.parent))

    def imports(self) -> list[Import]:
        return imports_in(self.tree, self.module, self.path.name == "__init__.py")

    def labctl_imports(self) -> list[Import]:
        return [i for i in self.imports() if i.target == "labctl" or i.target.startswith("labctl.")]


@functools.cache
def sources() -> tuple[Source, ...]:
    return tuple(Source(p, module_name(p), ast.parse(p.read_text(), str(p))) for p in sorted(ROOT.rglob("*.py")))


def packages() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("__init__.py"))}


def docstring(init: Path) -> str:
    return ast.get_docstring(ast.parse(init.read_text())) or ""


def rule_of(doc: str) -> list[str]:
    """Every package an ``Imports never:`` line names (all such lines, with continuation lines:
    indented lines right after one that go on naming packages)."""
    out: list[str] = []
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(RULE):
            continue
        text = line[len(RULE):]
        for more in lines[i + 1:]:
            if not more.startswith((" ", "\t")) or not more.strip().startswith("labctl."):
                break
            text += "," + more
        out += [w.strip() for w in text.split(",") if w.strip()]
    return out


def rules() -> dict[str, list[str]]:
    return {name: rule for name, init in packages().items() if (rule := rule_of(docstring(init)))}


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def existing(module: str) -> bool:
    rel = Path(*module.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


def stage_of(module: str) -> str:
    """``labctl.x`` for anything in package or module x."""
    return ".".join(module.split(".")[:2])


# --------------------------------------------------------------------------- Imports never


def test_every_stage_package_states_its_rule() -> None:
    stages = [n for n in packages() if n.count(".") == 1 and n not in UNRULED]
    missing = [n for n in stages if n not in rules()]
    assert not missing, f"packages whose docstring has no '{RULE}' line: {missing}"


def unread_rules(doc: str) -> list[str]:
    """Lines of a docstring that mention the rule but that :func:`rule_of` does not read (a rule
    written mid-line, indented, or in another case would go unenforced)."""
    return [line for line in doc.splitlines() if RULE.lower() in line.lower() and not line.startswith(RULE)]


def test_no_rule_line_goes_unread() -> None:
    found = {name: lines for name, init in packages().items() if (lines := unread_rules(docstring(init)))}
    assert not found, found


@pytest.mark.parametrize("doc", ["Owns x. Imports never: labctl.cli\n", "  Imports never: labctl.cli\n",
                                 "imports never: labctl.cli\n", "* Imports never: labctl.cli\n"])
def test_a_rule_written_where_it_is_not_read_is_caught(doc: str) -> None:
    assert unread_rules(doc)


def test_every_rule_names_real_packages() -> None:
    for pkg, forbidden in rules().items():
        for f in forbidden:
            assert existing(f), f"{pkg}: '{RULE}' names {f}, which does not exist"


def broken_rules(table: dict[str, list[str]]) -> list[str]:
    broken = []
    for src in sources():
        for pkg, forbidden in table.items():
            if not is_under(src.module, pkg):
                continue
            for imp in src.imports():
                if imp.dynamic and imp.target == "?":
                    broken.append(f"{src.rel}:{imp.line}: a dynamic import of a name the rules cannot read")
                    continue
                hit = next((f for f in forbidden if is_under(imp.target, f)), None)
                if hit:
                    broken.append(f"{src.rel}:{imp.line}: {src.module} imports {imp.target} "
                                  f"({pkg} says '{RULE} {hit}')")
    return broken


def test_no_package_imports_what_its_docstring_forbids() -> None:
    broken = broken_rules(rules())
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("source, expected", [
    ("from labctl.up import warm\n", {"labctl.up", "labctl.up.warm"}),
    ("import labctl.up.warm as w\n", {"labctl.up.warm"}),
    ("def f():\n    import labctl.cli.main\n", {"labctl.cli.main"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labctl.steps.result import R\n",
     {"labctl.steps.result", "labctl.steps.result.R"}),
    ("import importlib\nm = importlib.import_module('labctl.report')\n", {"labctl.report"}),
    ("from importlib import import_module as im\nm = im('labctl.cli')\n", {"labctl.cli"}),
    ("m = __import__('labctl.bundle.write')\n", {"labctl.bundle.write"}),
    ("from .. import report\n", {"labctl", "labctl.report"}),
    ("from ..report import html\n", {"labctl.report", "labctl.report.html"}),
])
def test_the_walk_sees_every_kind_of_import(source: str, expected: set[str]) -> None:
    tree = ast.parse(source)
    assert {i.target for i in imports_in(tree, "labctl.x.m", False) if i.target.startswith("labctl")} == expected


@pytest.mark.parametrize("doc, expected", [
    ("Owns x.\n\nImports never: labctl.a, labctl.b\n", ["labctl.a", "labctl.b"]),
    ("Imports never: labctl.a\nMore prose.\nImports never: labctl.c\n", ["labctl.a", "labctl.c"]),
    ("Imports never: labctl.a,\n    labctl.b, labctl.c\nprose\n", ["labctl.a", "labctl.b", "labctl.c"]),
])
def test_every_rule_line_is_read(doc: str, expected: list[str]) -> None:
    assert rule_of(doc) == expected


@pytest.mark.parametrize("line", [
    "import labctl.cli.main",
    "from labctl.cli import main",
    "import importlib\nimportlib.import_module('labctl.cli.main')",
    "import importlib\nimportlib.import_module('labctl.' + 'cli')",
])
def test_a_forbidden_import_is_caught_however_written(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of labctl.trace (which never imports the CLI) with the import written each way."""
    planted = Source(ROOT / "trace" / "planted.py", "labctl.trace.planted", ast.parse(line + "\n"))
    real = sources()
    monkeypatch.setattr(sys.modules[__name__], "sources", lambda: (*real, planted))
    assert any("labctl.trace.planted" in b or "trace/planted.py" in b for b in broken_rules(rules()))


@pytest.mark.parametrize("line", ["from labctl.backends import get_backend", "import labctl.backends.monitor"])
def test_the_bundle_imports_no_backend(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is written from what the run recorded: labctl.bundle imports no backend, not even
    the interface (it asked every guest's QEMU its version over QMP once)."""
    assert "labctl.backends" in rules()["labctl.bundle"]
    planted = Source(ROOT / "bundle" / "planted.py", "labctl.bundle.planted", ast.parse(line + "\n"))
    real = sources()
    monkeypatch.setattr(sys.modules[__name__], "sources", lambda: (*real, planted))
    assert any("labctl.bundle.planted" in b for b in broken_rules(rules()))


# --------------------------------------------------------------------------- loops


def stage_graph() -> dict[str, dict[str, str]]:
    """stage -> stage it imports -> where (the first such import)."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for src in sources():
        for imp in src.labctl_imports():
            a, b = stage_of(src.module), stage_of(imp.target)
            if a != b and b != "labctl" and existing(b):
                edges[a].setdefault(b, f"{src.rel}:{imp.line}")
    return edges


def loops(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for e in edges.values() for w in e}):
        if v not in index:
            visit(v)
    return out


def test_no_package_loop_of_any_length() -> None:
    edges = stage_graph()
    found = loops(edges)
    text = [" -> ".join(c) + ": " + "; ".join(f"{a}->{b} at {edges[a][b]}" for a in c for b in c if b in edges[a])
            for c in found]
    assert not found, "\n".join(text)


def test_a_loop_through_three_packages_is_caught() -> None:
    assert loops({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}) == [["a", "b", "c"]]
    assert loops({"a": {"b": ""}, "b": {"c": ""}}) == []


# --------------------------------------------------------------------------- host processes


def process_uses(src: Source) -> Iterator[str]:
    """Where ``src`` runs a host process itself (imports subprocess, calls os.exec*/os.system...)."""
    for imp in src.imports():
        if any(is_under(imp.target, m) for m in PROCESS_MODULES):
            yield f"{src.rel}:{imp.line}: imports {imp.target}"
        elif imp.target == "os" and set(imp.names) & PROCESS_CALLS:
            yield f"{src.rel}:{imp.line}: imports {', '.join(sorted(set(imp.names) & PROCESS_CALLS))} from os"
        elif is_under(imp.target, "asyncio") and set(imp.names) & ASYNC_PROCESS_CALLS:
            yield f"{src.rel}:{imp.line}: imports {', '.join(sorted(set(imp.names) & ASYNC_PROCESS_CALLS))} from asyncio"
    for node in ast.walk(src.tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PROCESS_CALLS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"):
            yield f"{src.rel}:{node.lineno}: calls os.{node.func.attr}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ASYNC_PROCESS_CALLS:
            yield f"{src.rel}:{node.lineno}: calls {node.func.attr}"


def test_only_proc_runs_host_processes() -> None:
    found = [w for src in sources() if src.module != PROCESS_HOME for w in process_uses(src)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line", ["import subprocess", "from subprocess import run", "import os\nos.execvp('x', [])",
                                  "from os import system", "import pty",
                                  "import asyncio\nasyncio.create_subprocess_exec('x')",
                                  "from asyncio import create_subprocess_shell",
                                  "import asyncio\nasyncio.get_running_loop().subprocess_exec(f, 'x')"])
def test_a_process_outside_proc_is_caught(line: str) -> None:
    src = Source(ROOT / "steps" / "planted.py", "labctl.steps.planted", ast.parse(line + "\n"))
    assert list(process_uses(src))


# --------------------------------------------------------------------------- the front


FRONT = ("labctl.image.build", "labctl.up.capacity")
FRONT_CALLS = ("prepare", "preflight", "refuse", "check", "all_prepared")


def test_the_front_of_the_pipeline_is_the_librarys() -> None:
    """The image build, kernel preparation, preflight and capacity check are called from
    ``labctl.pipeline.prepare`` only: the CLI parses and prints, it never sequences them."""
    found = []
    for path in sorted((ROOT / "cli").rglob("*.py")):
        src = Source(path, module_name(path), ast.parse(path.read_text(), str(path)))
        found += [f"{path.name}:{i.line}: imports {i.target}" for i in src.labctl_imports()
                  if i.target.startswith(FRONT)]
        aliases = {a.asname or a.name for node in ast.walk(src.tree) if isinstance(node, ast.ImportFrom)
                   and node.module == "labctl.kernel" for a in node.names if a.name == "lab"}
        found += [f"{path.name}:{node.lineno}: calls {node.func.value.id}.{node.func.attr}"
                  for node in ast.walk(src.tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in aliases and node.func.attr in FRONT_CALLS]
    assert not found, "\n".join(found)


LAB_UPS = ("lifecycle_cmds.py", "run_cmd.py", "class_cmd.py", "bisect_cmd.py")  # up, run, class up, bisect


def front_calls(path: Path) -> set[str]:
    """The functions of labctl.pipeline a CLI module calls."""
    tree = ast.parse(path.read_text(), str(path))
    names = {a.asname or a.name: a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "labctl.pipeline" for a in node.names}
    return {names[n.func.id] for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in names}


def test_every_command_that_brings_a_lab_up_goes_through_prepare() -> None:
    """up, run, class up and bisect call labctl.pipeline.prepare (capacity, image, kernels and their
    preflight), never the front's parts themselves."""
    for name in LAB_UPS:
        calls = front_calls(ROOT / "cli" / name)
        assert "prepare" in calls, f"cli/{name} does not call labctl.pipeline.prepare"
        assert not calls & {"prepare_image", "prepare_kernels", "_kernel_checks"}, f"cli/{name}: {calls}"


def defined_names(module: str) -> set[str] | None:
    """The names a labctl module defines at its top level (None: no such module)."""
    rel = Path(*module.split("."))
    for path in ((ROOT.parent / rel).with_suffix(".py"), ROOT.parent / rel / "__init__.py"):
        if path.is_file():
            tree = ast.parse(path.read_text(), str(path))
            names: set[str] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    names |= {(a.asname or a.name).split(".")[0] for a in node.names}
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
            return names
    return None


def test_every_labctl_import_resolves() -> None:
    """Every ``import labctl.x`` names a module, every ``from labctl.x import y`` a submodule or a name
    x defines: mypy (``ignore_missing_imports``) does not see a module that moved."""
    broken = []
    for src in sources():
        for imp in src.labctl_imports():
            if imp.dynamic:
                continue
            if imp.names:
                names = defined_names(imp.target)
                if names is None:
                    broken.append(f"{src.rel}:{imp.line}: no module {imp.target}")
                    continue
                broken += [f"{src.rel}:{imp.line}: {imp.target} has no {n}" for n in imp.names
                           if n != "*" and n not in names and defined_names(f"{imp.target}.{n}") is None]
            elif defined_names(imp.target) is None and not any(
                    i.names for i in src.imports() if i.line == imp.line):
                broken.append(f"{src.rel}:{imp.line}: no module {imp.target}")
    assert not broken, "\n".join(broken)


CONCRETE_BACKENDS = ("labctl.backends.qemu", "labctl.backends.libvirt")
BACKEND_NAMES = ("qemu", "libvirt")


def backend_leaks(src: Source) -> list[str]:
    """Where a module outside labctl.backends imports a concrete backend, or compares a string with a
    backend's name (what differs between backends is a method of the interface)."""
    if is_under(src.module, "labctl.backends"):
        return []
    found = [f"{src.rel}:{i.line}: imports {i.target}" for i in src.labctl_imports()
             if any(is_under(i.target, c) for c in CONCRETE_BACKENDS)]
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
            consts = [v for v in values if isinstance(v, ast.Constant)]
            consts += [e for v in values if isinstance(v, ast.Tuple | ast.List | ast.Set)
                       for e in v.elts if isinstance(e, ast.Constant)]
            if any(c.value in BACKEND_NAMES for c in consts):
                found.append(f"{src.rel}:{node.lineno}: compares with a backend's name")
    return found


def test_no_backend_is_named_or_imported_outside_backends() -> None:
    found = [w for src in sources() for w in backend_leaks(src)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line", ["if state.backend == 'libvirt': pass", "x = b in ('qemu',)",
                                  "from labctl.backends.libvirt import saved", "import labctl.backends.qemu.argv"])
def test_a_backend_leak_is_caught(line: str) -> None:
    src = Source(ROOT / "training" / "planted.py", "labctl.training.planted", ast.parse(line + "\n"))
    assert backend_leaks(src)


# --------------------------------------------------------------------------- faces, names, sizes


def face_all(package: str) -> list[str] | None:
    """A package's ``__all__`` (None when it has none)."""
    init = ROOT.parent / Path(*package.split(".")) / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            return [str(v) for v in ast.literal_eval(node.value)]
    return None


def stage_packages() -> list[str]:
    return [n for n in packages() if n.count(".") == 1]


@functools.cache
def kind_lab_modules() -> frozenset[str]:
    """The lab modules of the step kinds (docs/development.md, "Adding a step kind"): where a kind's
    declared record types live. A kind is one place: its run (``labctl/steps/``) and its report section
    (``labctl/report/``) import its types from there, with no line in the lab's face."""
    import typing

    from labctl.lab import STEP_KINDS

    types = [t for d in STEP_KINDS for _, rec in d.records for t in (rec, *typing.get_args(rec))]
    return frozenset(m for t in types if (m := getattr(t, "__module__", "")).startswith("labctl.lab."))


def past_faces(src: Source) -> list[str]:
    """Where ``src`` reaches into another package instead of importing its face (``from labctl.x import
    name``, the name in labctl.x's ``__all__``; a face hands on names, not modules). A step kind's lab
    module (:func:`kind_lab_modules`) is the kind's own: its run and its section import it directly."""
    me = stage_of(src.module)
    found = []
    for imp in src.imports():
        if imp.dynamic or not imp.names or not imp.target.startswith("labctl."):
            continue
        face = stage_of(imp.target)
        if face == me or face not in stage_packages() or imp.target in kind_lab_modules():
            continue
        if imp.target != face:
            found.append(f"{src.rel}:{imp.line}: imports {imp.target} (past the face of {face})")
            continue
        exported = set(face_all(face) or ())
        found += [f"{src.rel}:{imp.line}: {face} does not export {n} (its __all__)" for n in imp.names
                  if n not in exported]
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                face = stage_of(a.name)
                if a.name.startswith("labctl.") and face != me and face in stage_packages() and a.name != face:
                    found.append(f"{src.rel}:{node.lineno}: import {a.name} (past the face of {face})")
    return found


def test_every_package_has_a_face() -> None:
    """Subpackages too (a backend's says it has none: it is reached through labctl.backends)."""
    missing = [p for p in packages() if p != "labctl" and face_all(p) is None]
    assert not missing, f"packages without __all__ in their __init__: {missing}"


def test_other_packages_import_only_the_face() -> None:
    found = [w for src in sources() for w in past_faces(src)]
    assert not found, "\n".join(found)


def test_a_step_kinds_run_imports_its_lab_module_directly() -> None:
    src = Source(ROOT / "steps" / "planted.py", "labctl.steps.planted",
                 ast.parse("from labctl.lab.stepsysctl import SysctlRecord\n"))
    assert "labctl.lab.stepsysctl" in kind_lab_modules() and not past_faces(src)


@pytest.mark.parametrize("line", ["from labctl.report.run_summary import summarize", "import labctl.up.lifecycle",
                                  "from labctl.report import not_exported",
                                  "from labctl.lab.followspec import FollowSpec",  # a lab module no kind declares records in
                                  "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labctl.up.options import UpOptions"])
def test_an_import_past_a_face_is_caught(line: str) -> None:
    src = Source(ROOT / "steps" / "planted.py", "labctl.steps.planted", ast.parse(line + "\n"))
    assert past_faces(src)


def modules_handed_on(package: str, exported: list[str]) -> list[str]:
    """The names of ``exported`` (a face's ``__all__``) that ``package`` hands on as modules, even once
    a submodule of the same name is loaded (``labctl.training.reset``, the function, beside its module)."""
    import importlib
    import types

    face = importlib.import_module(package)
    here = ROOT.parent / Path(*package.split("."))
    found = []
    for n in exported:
        if (here / f"{n}.py").is_file() or (here / n / "__init__.py").is_file():
            importlib.import_module(f"{package}.{n}")
        if isinstance(getattr(face, n), types.ModuleType):
            found.append(n)
    return found


def test_no_face_hands_on_a_module() -> None:
    """A face hands on names (``from labctl.bisect import make_oracle``), never a module to reach
    through (``oracle.make``): what a package offers is what its face lists."""
    found = {p: m for p in packages() if p != "labctl" and (m := modules_handed_on(p, face_all(p) or []))}
    assert not found, found


def test_a_module_handed_on_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import labctl.bisect
    import labctl.bisect.oracle

    monkeypatch.setattr(labctl.bisect, "oracle", labctl.bisect.oracle, raising=False)
    assert modules_handed_on("labctl.bisect", ["Bisector", "oracle"]) == ["oracle"]
    assert modules_handed_on("labctl.bisect", ["Bisector"]) == []


def name_clashes(modules: list[str], package_names: list[str]) -> dict[str, list[str]]:
    """Names that lead a reader to two places: a module name (``labctl/x/name.py``) used twice, or a
    module named like a package (``labctl/kernel/lab.py`` beside ``labctl/lab/``), whatever their level."""
    names: dict[str, list[str]] = defaultdict(list)
    for rel in modules:
        path = Path(rel)
        if path.name not in ("__init__.py", "__main__.py"):
            names[path.stem].append(rel)
    for pkg in package_names:
        if "." in pkg:
            names[pkg.rpartition(".")[2]].append(pkg.replace(".", "/") + "/")
    return {n: p for n, p in names.items() if len(p) > 1}


def module_files() -> list[str]:
    return [str(p.relative_to(ROOT.parent)) for p in sorted(ROOT.rglob("*.py"))]


def test_module_names_are_unique() -> None:
    clashes = name_clashes(module_files(), list(packages()))
    assert not clashes, clashes


@pytest.mark.parametrize("planted", ["labctl/kernel/lab.py", "labctl/bisect/report.py", "labctl/follow/live.py",
                                     "labctl/up/qemu.py", "labctl/trace/guest_kernels.py"])
def test_a_module_named_like_a_package_or_another_module_is_caught(planted: str) -> None:
    clashes = name_clashes([*module_files(), planted], list(packages()))
    assert planted in [rel for rels in clashes.values() for rel in rels], clashes


#: The registries that name a step kind's modules, by package (a kind's three modules are named where
#: its three lines are, not in the packages' docstrings: docs/development.md, "Adding a step kind").
KIND_REGISTRIES = {"labctl.lab": "stepkinds.py", "labctl.steps": "kinds.py", "labctl.report": "registry.py"}


def test_every_module_is_named_in_its_package_docstring() -> None:
    """In the package's docstring, or (a step kind's module) in its package's kind registry's."""
    missing = []
    for pkg, init in packages().items():
        doc = docstring(init)
        if pkg in KIND_REGISTRIES:
            doc += "\n" + docstring(init.parent / KIND_REGISTRIES[pkg])
        for child in sorted(init.parent.iterdir()):
            name = child.stem if child.suffix == ".py" else child.name if (child / "__init__.py").is_file() else None
            if name in (None, "__init__", "__main__"):
                continue
            if f":mod:`.{name}`" not in doc and f":mod:`{pkg}.{name}`" not in doc:
                missing.append(f"{pkg}.{name}")
    assert not missing, f"modules their package's docstring does not name: {missing}"


MAX_CLASS_LINES = 250


def test_no_class_over_250_lines() -> None:
    big = [f"{src.rel}:{node.lineno}: {node.name} {node.end_lineno - node.lineno + 1} lines"
           for src in sources() for node in ast.walk(src.tree)
           if isinstance(node, ast.ClassDef) and node.end_lineno and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert not big, "\n".join(big)


def module_graph() -> dict[str, dict[str, str]]:
    """module -> labctl module it imports -> where; ``from labctl.x import y`` counts as importing the
    package labctl.x (its face runs) as well as the module labctl.x.y when there is one."""
    known = {src.module for src in sources()}
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for src in sources():
        for imp in src.labctl_imports():
            target = imp.target
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target not in (src.module, "labctl"):
                edges[src.module].setdefault(target, f"{src.rel}:{imp.line}")
    return edges


def test_no_module_imports_itself_back() -> None:
    """No loop between modules either, a face included: a module of a package imports its siblings
    (``import labctl.x.y as y``), never its own package's face, which imports it."""
    edges = module_graph()
    found = loops(edges)
    text = [" -> ".join(c) + ": " + "; ".join(f"{a}->{b} at {edges[a][b]}" for a in c for b in c if b in edges[a])
            for c in found]
    assert not found, "\n".join(text)
