"""The pipeline's shape, checked: each package's docstring says what it never imports, in a line
``Imports never: labctl.x, labctl.y``, and no module of the package does (lazy imports inside
functions and ``TYPE_CHECKING`` imports count too). No package imports one that imports it back.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import labctl

ROOT = Path(labctl.__file__).resolve().parent
RULE = "Imports never:"
# Packages that may import anything: the CLI sits on top of every stage.
UNRULED = {"labctl.cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every labctl module ``path`` imports (absolute, with its line), wherever the import sits."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from labctl.x import y`` may import the module labctl.x.y
            found.append((target, node.lineno))
            found += [(f"{target}.{a.name}", node.lineno) for a in node.names]
    return [(t, line) for t, line in found if t == "labctl" or t.startswith("labctl.")]


def packages() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("__init__.py"))}


def rules() -> dict[str, list[str]]:
    out = {}
    for name, init in packages().items():
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        lines = [line for line in doc.splitlines() if line.startswith(RULE)]
        if lines:
            out[name] = [w.strip() for w in lines[0][len(RULE):].split(",") if w.strip()]
    return out


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def existing(module: str) -> bool:
    rel = Path(*module.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


def test_every_stage_package_states_its_rule() -> None:
    stages = [n for n in packages() if n.count(".") == 1 and n not in UNRULED]
    missing = [n for n in stages if n not in rules()]
    assert not missing, f"packages whose docstring has no '{RULE}' line: {missing}"


def test_every_rule_names_real_packages() -> None:
    for pkg, forbidden in rules().items():
        for f in forbidden:
            assert existing(f), f"{pkg}: '{RULE}' names {f}, which does not exist"


def test_no_package_imports_what_its_docstring_forbids() -> None:
    broken = []
    table = rules()
    for path in sorted(ROOT.rglob("*.py")):
        mod = module_name(path)
        for pkg, forbidden in table.items():
            if not is_under(mod, pkg):
                continue
            for target, line in imports_of(path):
                hit = next((f for f in forbidden if is_under(target, f)), None)
                if hit:
                    broken.append(f"{path.relative_to(ROOT.parent)}:{line}: {mod} imports {target} "
                                  f"({pkg} says '{RULE} {hit}')")
    assert not broken, "\n".join(broken)


def stage_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_two_stages_import_each_other() -> None:
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(ROOT.rglob("*.py")):
        mod = module_name(path)
        for target, line in imports_of(path):
            a, b = stage_of(mod), stage_of(target)
            if a != b and existing(target) and b != "labctl":
                edges[a].setdefault(b, f"{path.relative_to(ROOT.parent)}:{line}")
    loops = sorted(f"{a} <-> {b}: {edges[a][b]} and {edges[b][a]}"
                   for a in edges for b in edges[a] if a < b and a in edges.get(b, {}))
    assert not loops, "\n".join(loops)


@pytest.mark.parametrize("source, expected", [
    ("from labctl.up import warm\n", {"labctl.up", "labctl.up.warm"}),
    ("def f():\n    import labctl.cli.main\n", {"labctl.cli.main"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labctl.steps.result import R\n",
     {"labctl.steps.result", "labctl.steps.result.R"}),
])
def test_the_walk_sees_every_kind_of_import(tmp_path: Path, source: str, expected: set[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "labctl" / "x"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "labctl")
    assert {t for t, _ in imports_of(pkg / "m.py")} == expected


FRONT = ("labctl.image.build", "labctl.training.capacity")
FRONT_CALLS = ("prepare", "preflight", "refuse", "check", "all_prepared")


def test_the_front_of_the_pipeline_is_the_librarys() -> None:
    """The image build, kernel preparation, preflight and capacity check are called from
    ``labctl.pipeline.prepare`` only: the CLI parses and prints, it never sequences them."""
    found = []
    for path in sorted((ROOT / "cli").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.name}:{line}: imports {t}" for t, line in imports_of(path) if t.startswith(FRONT)]
        aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module == "labctl.kernel" for a in node.names if a.name == "lab"}
        found += [f"{path.name}:{node.lineno}: calls {node.func.value.id}.{node.func.attr}"
                  for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in aliases and node.func.attr in FRONT_CALLS]
    assert not found, "\n".join(found)
