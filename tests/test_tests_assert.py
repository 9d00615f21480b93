"""Every test asserts something: a test function (def test_*, also a method of a Test* class)
that only runs code passes whatever the code computes, so none may come back.

A test counts as asserting when its body, or a function of the same file it names (called,
or passed on, e.g. run_distributed(_worker)), resolved by name and recursively, contains one
of: an `assert` statement; pytest.raises / warns / approx / fail / deprecated_call; a call of
a name starting with assert / check / expect / verify (optionally after one underscore, and
followed by `_`, a capital or nothing: `assert_close`, `_check_bytes`, `assertEqual`, not
`checkpoint`), which takes in torch.testing.assert_close and numpy's assert_array_equal.
Helpers imported from another file are not followed: such a test needs its own check.

A test whose whole claim is "does not raise" is still expected to check what it returned;
the rare genuine exception goes in ALLOWED below, with its one-line reason.
"""
import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
CHECKING_CALL = re.compile(r"^_?(assert|check|expect|verify)(_|[A-Z]|$)")
PYTEST_CHECKS = {"raises", "warns", "approx", "fail", "deprecated_call"}

# "tests/path/test_x.py::test_name" (or "...::TestClass::test_name") -> why it asserts nothing
ALLOWED: dict = {}

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _name_of_call(node: ast.Call):
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _scan(fn):
    """(whether fn's body checks something itself, the names it calls or passes on: f(...),
    self.f(...), g(f), g(self.f))."""
    checks, used = False, set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                used.add(node.id)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Load):
                used.add(node.attr)
            checks = checks or (node.attr in PYTEST_CHECKS and isinstance(node.value, ast.Name)
                                and node.value.id == "pytest")
        elif isinstance(node, ast.Assert):
            checks = True
        elif isinstance(node, ast.Call) and not checks:
            checks = bool(CHECKING_CALL.match(_name_of_call(node) or ""))
    return checks, used


def unasserted(source: str, filename: str = "<test>") -> list:
    """The qualified names ("test_x", "TestY::test_z") of the tests in `source` that assert
    nothing, by the rules of the module docstring."""
    tree = ast.parse(source, filename)
    functions = [node for node in ast.walk(tree) if isinstance(node, FUNCTIONS)]
    scans = {id(fn): _scan(fn) for fn in functions}
    used = {key: names for key, (_, names) in scans.items()}
    asserting = {key for key, (checks, _) in scans.items() if checks}
    names = {fn.name for fn in functions if id(fn) in asserting}
    grew = True
    while grew:   # a function naming an asserting function (of any depth) asserts
        grew = False
        for fn in functions:
            if id(fn) not in asserting and used[id(fn)] & names:
                asserting.add(id(fn))
                names.add(fn.name)
                grew = True

    tests = []
    for node in tree.body:
        if isinstance(node, FUNCTIONS) and node.name.startswith("test"):
            tests.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            tests += [(f"{node.name}::{m.name}", m) for m in node.body
                      if isinstance(m, FUNCTIONS) and m.name.startswith("test")]
    return [name for name, fn in tests if id(fn) not in asserting]


def test_every_test_asserts_something():
    found = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS.parent).as_posix()
        for name in unasserted(path.read_text(), str(path)):
            found[f"{rel}::{name}"] = path
    offenders = sorted(set(found) - set(ALLOWED))
    assert not offenders, ("tests that assert nothing (check what the test claims: a value, "
                           "a file, a count, a message; or add to ALLOWED with a reason):\n  "
                           + "\n  ".join(offenders))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that now assert, or are gone: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_check_finds_what_it_should():
    """The rules on small sources: each flagged or cleared for the reason it names."""
    source = '''
import pytest, torch

def _helper(x):
    assert x == 1

def _runs(x):
    return x

def _outer(x):
    _helper(x)

def checkpoint_save(x):
    return x

def _worker(rank):
    assert rank >= 0

def test_bare():
    _runs(1)

def test_assert():
    assert _runs(1) == 1

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_warns():
    with pytest.warns(UserWarning):
        _runs(1)

def test_close():
    torch.testing.assert_close(torch.ones(1), torch.ones(1))

def test_named_check():
    _check_it(1)

def test_checkpoint_is_no_check():
    checkpoint_save(1)

def test_helper():
    _runs(1)
    _outer(1)

def test_passed_on(run):
    run(_worker, 2)

def test_imported_helper():
    from elsewhere import run_and_compare
    run_and_compare()

class TestGroup:
    def _check(self):
        assert True

    def test_method_helper(self):
        self._check()

    def test_method_bare(self):
        _runs(2)

class Helper:
    def test_not_collected(self):
        pass
'''
    assert unasserted(source) == ["test_bare", "test_checkpoint_is_no_check",
                                  "test_imported_helper", "TestGroup::test_method_bare"]
