"""Imports run one way: tools/ and bench/ -> megatron.training -> megatron.cc.

Every .py file under megatron/, tools/ and bench/, and the entry script pretrain_gpt.py, is
parsed with `ast` (nothing imported); imports anywhere in a file count, deferred ones inside
functions included, relative ones resolved against the file's package, and
`importlib.import_module("...")` with a literal name too. Fails on a backward arrow (the entry
script sits with the driver: it imports nothing from tools/ or bench/, and they call the
driver, not the script), on an import cycle between modules of megatron/ or between its
packages, and on an underscore name imported from another package. Each failure names
file:line.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("megatron", "tools", "bench")
# Lower layers must not import higher ones.
LAYERS = {"megatron.cc": 0, "megatron.training": 1, "pretrain_gpt": 1, "tools": 2, "bench": 2}
ENTRY = ROOT / "pretrain_gpt.py"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    """{module name: path} of every .py file of ours."""
    found = {_module_name(p): p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))}
    found[_module_name(ENTRY)] = ENTRY
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if _is_package(path) else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, ours: dict):
    """(line, target module, imported name or None) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in ours:  # `from pkg import submodule`
                    yield node.lineno, sub, None
                else:
                    yield node.lineno, target, alias.name
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value, None


def _layer(module: str):
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def _owner(module: str, ours: dict) -> str:
    """The module itself when it is a module of ours, else its longest prefix that is."""
    while module and module not in ours:
        module = module.rpartition(".")[0]
    return module


def _package(module: str, ours: dict) -> str:
    return module if _is_package(ours[module]) else module.rpartition(".")[0]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def _top_level_names(path: Path) -> set:
    """Names a module defines or imports at its top level (what `from it import x` can take)."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):   # guarded definitions count too
            names.update(_top_level_names_of(node))
    return names


def _top_level_names_of(node) -> set:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
            found.add(sub.name)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            found.add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return found


def _unresolved(ours):
    """file:line of every import of megatron.* (deferred ones included) in our code and the
    tests naming no module of ours or no name its module defines: a module moved or renamed
    without its callers."""
    bad, names = [], {}
    tests = {_module_name(p): p for p in sorted((ROOT / "tests").rglob("*.py"))}
    for module, path in {**ours, **tests}.items():
        for line, target, name in _imports(module, path, ours):
            if not target.startswith(("megatron.cc", "megatron.training")):
                continue
            if target not in ours:
                bad.append(f"{_where(path, line)}: no module {target}")
            elif name and name != "*":
                if target not in names:
                    names[target] = _top_level_names(ours[target])
                if name not in names[target]:
                    bad.append(f"{_where(path, line)}: {target} has no {name}")
    return sorted(set(bad))


def _scan():
    ours = _modules()
    edges, backward, private = {}, [], []
    for module, path in ours.items():
        for line, target, name in _imports(module, path, ours):
            owner = _owner(target, ours)
            if not owner:
                continue  # third party or stdlib (megatron.core included)
            src, dst = _layer(module), _layer(owner)
            if src is not None and dst is not None and (
                    dst > src or owner == "pretrain_gpt" and module != owner):
                backward.append(f"{_where(path, line)}: {module} imports {target}")
            if owner.startswith("megatron.") and module.startswith("megatron.") and owner != module:
                edges.setdefault(module, {}).setdefault(owner, (path, line))
            if (name and name.startswith("_") and not name.startswith("__")
                    and _package(owner, ours) != _package(module, ours)):
                private.append(f"{_where(path, line)}: {module} imports private {target}.{name}")
    return edges, sorted(set(backward)), sorted(set(private))


def _package_edges(edges, ours):
    """The module edges lifted to their packages (megatron.cc.pipeline.p2p -> megatron.cc)."""
    lifted = {}
    for src, targets in edges.items():
        for dst, where in targets.items():
            a, b = _package(src, ours), _package(dst, ours)
            if a != b:
                lifted.setdefault(a, {}).setdefault(b, where)
    return lifted


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _describe(component, edges):
    members = set(component)
    lines = [f"cycle between {', '.join(component)}:"]
    for src in component:
        for dst, (path, line) in sorted(edges.get(src, {}).items()):
            if dst in members:
                lines.append(f"  {_where(path, line)}: {src} imports {dst}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def scan():
    return _scan()


def test_no_backward_imports(scan):
    _, backward, _ = scan
    assert not backward, "imports against tools/bench -> megatron.training -> megatron.cc:\n" + \
        "\n".join(backward)


def test_no_import_cycles_in_megatron(scan):
    edges, _, _ = scan
    cycles = _cycles(edges)
    assert not cycles, "\n".join(_describe(c, edges) for c in cycles)


def test_no_import_cycles_between_packages(scan):
    """A package is a layer of its own: two packages importing each other (even through
    different modules) cannot be read, tested or moved apart."""
    edges, _, _ = scan
    packages = _package_edges(edges, _modules())
    cycles = _cycles(packages)
    assert not cycles, "\n".join(_describe(c, packages) for c in cycles)


def test_imports_resolve():
    bad = _unresolved(_modules())
    assert not bad, "imports of modules or names that do not exist:\n" + "\n".join(bad)


def test_no_private_names_across_packages(scan):
    _, _, private = scan
    assert not private, "underscore names imported from another package:\n" + "\n".join(private)


def test_checker_catches_each_kind(tmp_path):
    """The resolver sees deferred and relative imports, and the cycle finder reports a loop."""
    src = "def f():\n    from . import b\n    from ..training import x\n"
    path = ROOT / "megatron" / "cc" / "a.py"
    node_list = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)]
    assert _resolve("megatron.cc.a", path, node_list[0]) == "megatron.cc"
    assert _resolve("megatron.cc.a", path, node_list[1]) == "megatron.training"
    assert _layer("megatron.cc.a") < _layer("megatron.training.x") < _layer("tools.y")
    edges = {"a": {"b": (path, 1)}, "b": {"c": (path, 2)}, "c": {"a": (path, 3)}, "d": {"a": (path, 4)}}
    assert _cycles(edges) == [["a", "b", "c"]]
    ours = {"p.x": path, "p.y": path, "q.z": path}   # two modules of p, one of q
    lifted = _package_edges({"p.x": {"q.z": (path, 5)}, "q.z": {"p.y": (path, 6)}}, ours)
    assert _cycles(lifted) == [["p", "q"]]
    assert _layer("pretrain_gpt") == _layer("megatron.training.x")
