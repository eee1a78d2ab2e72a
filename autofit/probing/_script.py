"""Find the train function in a user's script: `train.py` or `train.py:func`."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from autofit.errors import UsageError


def parse_target(target: str) -> tuple[str, str | None]:
    """'train.py:func' -> ('train.py', 'func'); 'train.py' -> ('train.py', None)."""
    path, sep, name = target.rpartition(":")
    if sep and name.isidentifier() and path:
        return path, name
    return target, None


def check_script(path: str) -> str:
    """The absolute path of an existing Python file that compiles, or a UsageError. Compiling runs
    none of the script: a syntax error is named here, in one line, before any process imports it."""
    if not os.path.isfile(path):
        raise UsageError(f"The training script must be an existing file, but {path!r} does not exist.")
    with open(path, "rb") as handle:
        source = handle.read()
    try:
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: a null byte, before Python 3.12
        raise UsageError(_syntax_message(path, exc)) from None
    return os.path.abspath(path)


def _syntax_message(path: str, exc: SyntaxError | ValueError) -> str:
    """What is wrong and where, as one line: the file and line, Python's reason, the line's text."""
    lineno = getattr(exc, "lineno", None)
    where = f"{path}:{lineno}" if lineno else path
    reason = f"{type(exc).__name__}: {getattr(exc, 'msg', None) or exc}"
    text = (getattr(exc, "text", None) or "").strip()
    shown = f": `{text}`" if text else ""
    return f"The training script must be valid Python, but {where} is not ({reason}){shown}. Fix it and run again."


def load_script(path: str) -> ModuleType:
    """Import the script as a module (not as __main__, so its `if __name__ == "__main__"` stays put).

    `sys.argv` becomes what `python script.py ARGS` gives the script (ARGS: those after `--`, through
    $AUTOFIT_SCRIPT_ARGS), so a script that parses its arguments at import (argparse's `parse_args()`,
    as pytorch/examples do) gets them, or its defaults, rather than the arguments of the process that
    loads it (only autofit's child processes do)."""
    path = check_script(path)
    sys.argv = [path, *script_args_from_env()]
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = "autofit_user_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"The training script must be a Python file, but got {path!r}.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def decorated_name(path: str) -> str | None:
    """The name of the script's one @autofit function, read from its source without running it (the
    searching process never imports the user's module): studies and files are named after it. None
    when the source does not say (no decorated function, several, or a file Python cannot parse):
    the worker, which imports the script, then names the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None

    def is_autofit(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return (isinstance(target, ast.Name) and target.id == "autofit") or (
            isinstance(target, ast.Attribute) and target.attr == "autofit")

    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             and any(is_autofit(d) for d in node.decorator_list)]
    return names[0] if len(names) == 1 else None


def decorated_functions(module: ModuleType) -> dict[str, Any]:
    """The @autofit functions the module defines, by name."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if getattr(type(obj), "__autofit__", False) and getattr(obj, "__module__", None) == module.__name__
    }


def find_function(module: ModuleType, name: str | None, script: str) -> Any:
    """The function to probe: the named one, or the only decorated one."""
    found = decorated_functions(module)
    if name is not None:
        obj = getattr(module, name, None)
        if obj is None or not callable(obj):
            raise UsageError(f"The function {name!r} must be defined in {script}, but it is not.")
        return obj
    if not found:
        raise UsageError(no_function_message(script))
    if len(found) > 1:
        names = ", ".join(sorted(found))
        raise UsageError(
            f"The script defines several @autofit functions ({names}): name one, as {script}:{sorted(found)[0]}."
        )
    return next(iter(found.values()))


def no_function_message(script: str, unread: bool = False) -> str:
    """The one line for a script with neither an @autofit function nor an `autofit.start` call; `unread`:
    known from its source, before any of it ran (a module-level training script is not imported to learn it)."""
    return (f"The script must define a function decorated with @autofit, or call autofit.start(...) at module "
            f"level, but {script} does neither" + (" (read from its source: none of it ran)" if unread else "")
            + ". See docs/guide/script.md to convert a module-level script with one line.")


def may_define_autofit(path: str) -> bool:
    """Whether the script's source could define an @autofit function: it names the decorator anywhere (as
    `autofit`, an alias imported from autofit, or `<module>.autofit`). False for a module-level training
    script that never does, which importing would run whole before the worker could say so; True where
    the source cannot be read (the import then names the problem)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return True
    names = {"autofit"} | {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                           and (node.module or "").split(".")[0] == "autofit" for alias in node.names
                           if alias.name == "autofit"}
    return any((isinstance(node, ast.Name) and node.id in names)
               or (isinstance(node, ast.Attribute) and node.attr == "autofit") for node in ast.walk(tree))


def calls_start(path: str) -> bool:
    """Whether the script calls `autofit.start(...)` (or `start(...)` imported from autofit), read from
    its source without running it: such a script is probed whole, from its top."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return False
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "autofit" for alias in node.names if alias.name == "start"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "start" and isinstance(func.value, ast.Name) \
                and func.value.id == "autofit":
            return True
        if isinstance(func, ast.Name) and func.id in imported:
            return True
    return False


class ScriptEntry:
    """A script that calls `autofit.start`, as the function a probe calls: `entry(run)` executes the
    script from its top as `__main__` (runpy: fresh globals every time) with its own `sys.argv`, and its
    `autofit.start` returns `run`. The probe's run ends the script after its measured steps, by an
    exception out of the optimizer's step that the script does not catch (`ProbeFinished`)."""

    __name__ = "train"  # studies and files are named as for a script's one decorated function

    def __init__(self, path: str, args: list[str] | tuple[str, ...] = ()) -> None:
        self.path = check_script(path)
        self.args = list(args)
        self.options: Any = None
        """The arguments of the script's `autofit.start`, as SearchOptions (known once `load` ran)."""

    def load(self) -> Any:
        """Run the script's top as far as its `autofit.start` call and keep that call's options; the
        rest of the script (its training) does not run here."""
        from autofit.runtime import StartReached, offer_script_run

        try:
            with offer_script_run(None):
                self._execute()
        except StartReached as reached:
            self.options = reached.options
            return self.options
        raise UsageError(f"The script {self.path} must call autofit.start(...), but it ended without calling it.")

    def __call__(self, run: Any) -> None:
        from autofit.runtime import offer_script_run

        with offer_script_run(run):
            self._execute()

    def _execute(self) -> None:
        import runpy

        sys.argv = [self.path, *self.args]
        directory = os.path.dirname(self.path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        try:
            runpy.run_path(self.path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):  # the script's own sys.exit() after its training is its return
                raise


#: The script's own arguments (JSON list), for every child process that executes it: probes, the
#: confirmation, the memory estimator. `autofit search train.py -- ARGS` sets it.
SCRIPT_ARGS_ENV = "AUTOFIT_SCRIPT_ARGS"


def script_args_from_env() -> list[str]:
    """The arguments the script is run with (`$AUTOFIT_SCRIPT_ARGS`); none when unset."""
    import json

    raw = os.environ.get(SCRIPT_ARGS_ENV)
    return [str(a) for a in json.loads(raw)] if raw else []


def pass_script_args(args: list[str] | tuple[str, ...]) -> None:
    """Hand `args` to every child process this one starts from now on (its environment)."""
    import json

    if args:
        os.environ[SCRIPT_ARGS_ENV] = json.dumps(list(args))
    else:
        os.environ.pop(SCRIPT_ARGS_ENV, None)
