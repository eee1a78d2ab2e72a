"""The package's layout keeps its rules: no module reaches into another subpackage's private modules,
no import circle, no import up a floor, no class over 250 lines or function over 60, at most 12 modules
at the top, and the processes that must start light (the CLI, every probe's child) import no torch,
optuna or pandas at import time."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PACKAGE = os.path.join(REPO, "autofit")


def _modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(path: str, *, top_level_only: bool) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [n for n in names if n == "autofit" or n.startswith("autofit.")]


def test_no_module_imports_another_subpackages_private_modules():
    offending = []
    for module, path in _modules().items():
        parts = module.split(".")  # autofit.<subpackage>[.<module>]: the subpackage a module is inside
        inside = len(parts) >= 3 or (len(parts) == 2 and os.path.basename(path) == "__init__.py")
        own = parts[1] if inside else None
        for imported in _imports(path, top_level_only=False):
            target = imported.split(".")
            if len(target) >= 3 and target[2].startswith("_") and target[1] != own:
                offending.append(f"{module} imports {imported}")
    assert offending == []


def test_no_import_circle():
    """Counted over every import, at module level or inside a function: a lazy import is an arrow too."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {resolve(i) for i in _imports(p, top_level_only=False)} - {None, m} for m, p in modules.items()}
    # A package's __init__ is imported before any of its modules: a module importing its own package
    # (or an ancestor) is part of that package's import, not a circle.
    graph = {m: {i for i in deps if not m.startswith(i + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (found := visit(nxt, [*trail, node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            assert visit(start, []) is None


#: The floors, lowest first: a module imports only from its own floor or below (the top-level modules
#: not named here, such as the decorator and the normal run's launch, are the top floor with the CLI).
FLOORS = (
    ("_version", "errors", "units", "redaction", "knobs"),
    ("config", "options", "export"),
    ("devices", "planner"),
    ("runtime",),
    ("integrations", "probing"),
    ("study",),
    ("memory",),
    ("findings",),
    ("forecast",),
    ("search",),
    ("report",),
    ("cli",),
)


def _floor(module: str) -> int:
    """autofit.<unit>[...]: the floor of its unit; a top-level module not named is on the top floor."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(FLOORS)
    unit = parts[1]
    for floor, units in enumerate(FLOORS):
        if unit in units:
            return floor
    if os.path.isdir(os.path.join(PACKAGE, unit)):
        raise AssertionError(f"the subpackage autofit.{unit} has no floor in FLOORS: place it")
    return len(FLOORS)


def test_no_import_runs_up_a_floor():
    up = [f"{module} imports {imported}" for module, path in _modules().items()
          for imported in _imports(path, top_level_only=False)
          if _floor(imported) > _floor(module)]
    assert up == []


def test_at_most_twelve_modules_at_the_top():
    top = [n for n in os.listdir(PACKAGE) if n.endswith(".py")]
    assert len(top) <= 12, sorted(top)


@pytest.mark.parametrize("module", ["autofit", "autofit.cli", "autofit.probing", "autofit.probing._worker_process",
                                    "autofit.probing._rank_process", "autofit.probing._rank_server",
                                    "autofit.memory._estimate_process"])
def test_light_processes_import_no_heavy_library(module):
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            "print(json.dumps(sorted(m for m in ('torch', 'optuna', 'pandas') if m in sys.modules)))")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []


def test_a_normal_run_imports_nothing_of_the_search(tmp_path):
    """`python train.py` loads the run and the best-config file, none of the probe, search or report machinery."""
    code = ("import json, sys, autofit\n"
            "@autofit.autofit\n"
            "def train(run):\n"
            "    return run.batch_size\n"
            "train()\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[:2] in ("
            "['autofit', 'probing'], ['autofit', 'search'], ['autofit', 'planner'], ['autofit', 'findings'], "
            "['autofit', 'memory'], ['autofit', 'study'], ['autofit', 'report']))))\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1]) == []


#: Where the first knobs of the config, which every part of autofit reads, are named: no ceiling.
CORE_KNOBS = ("precision", "batch_size", "accumulation_steps", "checkpoint_segments", "max_tokens", "compile")
#: The places of autofit/ (a subpackage or a top-level module each) that may name any other knob: its
#: declaration, where it is applied, the planner's order, an estimator hook, and one more (issue 38).
KNOB_PLACES = 5


def _places(name: str) -> set[str]:
    words = re.compile(rf"\b({re.escape(name)}|{re.escape(name.replace('_', '-'))})\b")
    return {os.path.relpath(path, PACKAGE).split(os.sep)[0] for path in _modules().values()
            if words.search(open(path, encoding="utf-8").read())}


def test_each_searched_knob_is_named_in_few_places():
    """CONTRIBUTING.md, "Adding a knob": a knob is declared once and the rest derived, so a new one is named
    where it is applied and ordered, not in every table."""
    from autofit.config import KNOBS

    over = {k.name: sorted(_places(k.name)) for k in KNOBS if k.name not in CORE_KNOBS
            and len(_places(k.name)) > KNOB_PLACES}
    assert over == {}


def test_a_memory_knob_takes_four_files_of_the_package_at_most():
    """Issue 47's proof that a memory knob costs what a compute knob does: activation offload, its declaration,
    where the run applies it and notes its offer, and the estimator's view of its host copies, in 4 files of
    autofit/ at most (the knob's name, or the PyTorch mechanism it runs on)."""
    words = re.compile(r"offload_activations|offload-activations|save_on_cpu|offload_block|offloaded_to")
    files = sorted(os.path.relpath(path, PACKAGE) for path in _modules().values()
                   if words.search(open(path, encoding="utf-8").read()))
    assert 0 < len(files) <= 4, files


def test_no_class_over_250_lines_and_no_function_over_60():
    too_long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            limit = 250 if isinstance(node, ast.ClassDef) else 60 if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            if limit is not None and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def _string_keyed_knob_reads(path: str) -> list[str]:
    """`knobs.get("autocast")`, `knobs["checkpoint_blocks"]`, `values_of("precision")`, `getattr(c, "compile")`: a knob
    (or an offer of autofit.knobs' Offers) read by its name written out, where a record's attribute, or the
    declarations (autofit.knobs), say it."""
    from autofit.config import KNOBS
    from autofit.knobs import Offers

    names = {k.name for k in KNOBS} | {f.name for f in dataclasses.fields(Offers)}
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        keys = [node.slice] if isinstance(node, ast.Subscript) else [*node.args, *(k.value for k in node.keywords)] \
            if isinstance(node, ast.Call) else []
        found += [f"{os.path.basename(path)}:{node.lineno} {key.value!r}" for key in keys
                  if isinstance(key, ast.Constant) and key.value in names]
    return found


def test_the_search_reads_no_knob_by_its_name():
    """Issue 47: the search reads what the function offers from its record (autofit.knobs' Offers) and each
    knob's values from the planner's rules; a knob added to the declaration needs no edit there."""
    search = os.path.join(PACKAGE, "search")
    assert [hit for name in sorted(os.listdir(search)) if name.endswith(".py")
            for hit in _string_keyed_knob_reads(os.path.join(search, name))] == []


def test_the_search_space_is_built_in_thirty_lines_at_most():
    """Issue 47: `SearchSpace.build` is the size axis and the knobs' values, each knob's rule its own."""
    tree = ast.parse(open(os.path.join(PACKAGE, "planner", "_search_space.py"), encoding="utf-8").read())
    space = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SearchSpace")
    build = next(n for n in space.body if isinstance(n, ast.FunctionDef) and n.name == "build")
    assert build.end_lineno - build.decorator_list[0].lineno + 1 <= 30


def test_runtime_imports_nothing_above_it():
    """What runs inside the user's process reads the config and nothing of the search, probes or reports."""
    allowed = ("autofit.config", "autofit.knobs", "autofit.errors", "autofit.units", "autofit.runtime")
    above = [f"{module} imports {imported}" for module, path in _modules().items()
             if module.startswith("autofit.runtime")
             for imported in _imports(path, top_level_only=False)
             if not imported.startswith(allowed)]
    assert above == []


def test_study_only_stores_and_reads():
    """The record imports nothing that interprets it: no planner, memory, devices, findings or search."""
    allowed = ("autofit.config", "autofit.errors", "autofit.units", "autofit._version", "autofit.export", "autofit.redaction",
               "autofit.probing", "autofit.study")
    above = [f"{module} imports {imported}" for module, path in _modules().items()
             if module.startswith("autofit.study")
             for imported in _imports(path, top_level_only=False)
             if not imported.startswith(allowed)]
    assert above == []


def test_only_the_white_box_tests_import_private_modules():
    """Tests go through what a subpackage exports (tests/whitebox/ says why it may not), and no test
    module imports another: what tests share lives in tests/support/."""
    tests = os.path.join(REPO, "tests")
    offending = []
    for folder, _, files in os.walk(tests):
        for name in files:
            if not name.endswith(".py") or folder.startswith(os.path.join(tests, "whitebox")):
                continue
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            for node in ast.walk(tree):
                modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for module in modules:
                    parts = module.split(".")
                    private = parts[0] == "autofit" and any(p.startswith("_") and p != "__init__" for p in parts[1:])
                    another_test = parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])
                    if private or another_test:
                        offending.append(f"{os.path.relpath(path, REPO)} imports {module}")
    assert offending == []


#: The best-config file's keys, at the top and in `measured` (less the schema's own, which every format has):
#: autofit.export alone reads them; everyone else reads `BestConfig`'s attributes.
_BEST_CONFIG_KEYS = frozenset({
    "partial", "config", "measured", "memory", "device", "world_size", "allocator", "versions", "script", "study",
    "why", "runner_ups", "ranked_by", "samples_per_s", "tokens_per_s", "peak_bytes", "probes", "confirmed",
    "unconfirmed", "ab", "rate_from", "rate_note", "flops_per_sample", "flops_per_token", "flops_per_s", "mfu",
    "joules_per_sample", "data_wait_share", "threads", "token_envelope", "profile"})
#: What holds the file, or its `measured`, by name (`document`, `stored.document()`, `best.measured`).
_BEST_CONFIG_HOLDERS = frozenset({"document", "measured"})


def _best_config_read(node: ast.AST) -> bool:
    """`holder[KEY]` or `holder.get(KEY)`, the holder a name above, `(holder or {})`, or such a read itself."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        holder, key = node.value, node.slice.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
          and isinstance(node.args[0], ast.Constant)):
        holder, key = node.func.value, node.args[0].value
    else:
        return False
    if key not in _BEST_CONFIG_KEYS:
        return False
    while True:
        if isinstance(holder, ast.BoolOp):
            holder = holder.values[0]
        elif isinstance(holder, ast.Call) and not (isinstance(holder.func, ast.Attribute) and holder.func.attr == "get"):
            holder = holder.func
        else:
            break
    name = holder.id if isinstance(holder, ast.Name) else holder.attr if isinstance(holder, ast.Attribute) else None
    return name in _BEST_CONFIG_HOLDERS or _best_config_read(holder)


def test_only_the_export_module_reads_the_best_config_files_keys():
    """One owner per format: the best-config file is read into `autofit.export.BestConfig` (and written from it)
    there; a report, the forecast, the search or the normal run that read its keys would be a second reader
    that an added or renamed field could pass by."""
    owner = os.path.join(PACKAGE, "export.py")
    reads = [f"{os.path.relpath(path, REPO)}:{node.lineno}: {ast.unparse(node)}"
             for path in _modules().values() if path != owner
             for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())) if _best_config_read(node)]
    assert reads == []


_LIMIT_PARAMETERS = {"memory_limit", "limit_bytes", "limit"}
_SHARE_PARAMETERS = {"usable_bytes", "usable", "headroom"}


def test_the_memory_budget_travels_as_one_object():
    """One owner per format: the memory limit and what is left of it to a config travel as one
    `autofit.export.MemoryBudget`; a function that took the limit beside the usable bytes (or the
    headroom) would be a second place that pairs them, which one caller could pass out of step. The
    command line is exempt: there the budget is given, as the --memory-limit and --headroom options."""
    owner, given = os.path.join(PACKAGE, "export.py"), os.path.join(PACKAGE, "cli", "")
    pairs = []
    for path in _modules().values():
        if path == owner or path.startswith(given):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
                if names & _LIMIT_PARAMETERS and names & _SHARE_PARAMETERS:
                    pairs.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {node.name}")
    assert pairs == []
