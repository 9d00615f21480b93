"""megatron/cc/plan is library code: it never imports the training driver (imports run
tools -> megatron/training -> megatron/cc)."""
import ast
import pathlib

import megatron.cc.plan as plan


def test_no_driver_imports():
    for path in pathlib.Path(plan.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("megatron.training") for n in names), (path, names)
