"""The run's parts take the control, not the Run (issue 47): no one-implementer Protocol stands in for the
Run or its control, `run.control` is made where the Run is made, the parts reach nothing through a
`.control` of something else, and the memory estimator declares its hooks (`RunHooks`) instead of
assigning methods on a live run."""

from __future__ import annotations

import ast
import os

from tests.conftest import REPO

RUNTIME = os.path.join(REPO, "autofit", "runtime")
RUNS_FACES = {"_run.py", "_view.py", "_run_data.py"}  # the Run itself: its `self.control`


def _tree(path: str) -> ast.Module:
    return ast.parse(open(path, encoding="utf-8").read())


def _runtime_modules() -> dict[str, ast.Module]:
    return {name: _tree(os.path.join(RUNTIME, name)) for name in sorted(os.listdir(RUNTIME)) if name.endswith(".py")}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def test_no_protocol_types_runtimes_parts():
    protocols = [f"{name}: {node.name}" for name, tree in _runtime_modules().items() for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef)
                 and any(getattr(base, "id", getattr(base, "attr", None)) == "Protocol" for base in node.bases)]
    assert protocols == []


def test_only_the_runs_maker_assigns_run_control():
    assigning = []
    for folder, _, files in os.walk(os.path.join(REPO, "autofit")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for node in ast.walk(_tree(path)):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
                if any(isinstance(t, ast.Attribute) and t.attr == "control" for t in targets):
                    assigning.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
    assert [where.rpartition(":")[0] for where in assigning] == ["autofit/runtime/_run.py"], assigning


def test_the_runs_parts_reach_nothing_through_a_control_attribute():
    """A part holds the control itself: `x.control.y` (the Run's) is for the Run's own faces alone."""
    reaching = [f"{name}:{node.lineno}" for name, tree in _runtime_modules().items() if name not in RUNS_FACES
                for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "control"]
    assert reaching == []


def test_the_estimator_assigns_no_method_on_a_live_object():
    """Its overrides are the run's declared hooks; only a class of torch's is patched (and put back)."""
    tree = _tree(os.path.join(REPO, "autofit", "memory", "_estimate_process.py"))
    functions = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assigned = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        method = isinstance(node.value, ast.Lambda) or (isinstance(node.value, ast.Name) and node.value.id in functions)
        for target in node.targets:
            root = _root(target)
            if (method and isinstance(target, ast.Attribute) and isinstance(root, ast.Name)
                    and root.id not in imported):
                assigned.append(f"{ast.unparse(target)} = {ast.unparse(node.value)}")
    assert assigned == []
