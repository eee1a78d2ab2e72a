"""Every place the package says something to its user, found in its source, and the family each belongs to
(issue 54, item 3). docs/guide/failures.md must explain every family; tests/docs/test_failures_page.py holds it.

A site is a raise (any exception built with a message: autofit's, click's, a builtin's), a warning
(`warnings.warn`, a logger's), a line on the terminal (`click.echo`/`secho`, `print`, a stream's `write`, a
click ParamType's `self.fail`, a `message` assigned or a `message=`/`..._message=` passed, as a normal run's plan
and a probe's record carry their text), or a note (what goes into a `notes` list, a `note=`, a reporter's `note()`: the
`note:` lines a search and a probe print). A function that passes one of its parameters on to such a call is
a site too, at each of its calls (`_warn(message)`, `Reporter._line(text)`), found to a fixed point.

A site's text is read from its expression: a string, an f-string (each `{...}` a placeholder), `+` of them,
either branch of `a if c else b`; a name is followed to its assignments in the function, the module or the
module it is imported from; a call to the package's own function, to what that function returns (a tuple's
element where the call is unpacked). Text the walk cannot follow (a parameter, `str(exc)`, a table built
line by line) is another site's or data, not a message, and has no family.

A family's key is the text's leading fixed words: from its first word, `KEY_WORDS` words, each placeholder
on the way kept as a wildcard. `The {what} list must not be empty` has the key "The … list must not be
empty"; the page matches it with "The ... list must not be empty" or "The precision list must not be
empty" (a wildcard is up to 80 characters of anything). So a message keeps its family while its tail is
reworded, and a new message whose leading words are new is a new family that needs its entry.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from tests.support import REPO

PACKAGE = os.path.join(REPO, "autofit")
PAGE = os.path.join(REPO, "docs", "guide", "failures.md")
#: Leading words a family's key holds (placeholders on the way do not count).
KEY_WORDS = 6
#: A wildcard on the page: a placeholder's value (or `...`, `X`, `N`) is at most this long.
WILDCARD = r".{0,80}?"
#: click's exceptions, built as `click.UsageError(...)` or by name.
CLICK_ERRORS = {"ClickException", "UsageError", "BadParameter", "BadOptionUsage", "BadArgumentUsage",
                "FileError", "NoSuchOption", "MissingParameter"}
_BUILTIN_ERRORS = {name for name, value in vars(builtins).items()  # not BaseException's control flow
                   if isinstance(value, type) and issubclass(value, Exception)}
_ECHO = {"echo", "secho", "print"}
_LOG = {"debug", "info", "warning", "error", "critical", "exception"}
_STR_METHODS = {"strip", "rstrip", "lstrip", "format", "removeprefix", "removesuffix", "capitalize"}
_WORD = re.compile(r"[A-Za-z]")
#: Fixed words a text needs to be a message (fewer: a table's row or a label, whose words are data).
MIN_WORDS = 2
Template = tuple  # of str (fixed text) and None (a placeholder)


@dataclass(frozen=True)
class Site:
    """One place that says something: where, what kind, and each text it can say."""

    where: str
    kind: str
    template: Template

    @property
    def key(self) -> str | None:
        return family_key(self.template)


def family_key(template: Template) -> str | None:
    """The template's leading fixed words (KEY_WORDS of them, placeholders on the way as '…'), or None where
    it holds no word to look for."""
    text = "".join("\0" if part is None else " ".join(part.replace("`", "").split(" ")) for part in template)
    text = re.sub(r"^\s*autofit:\s*(error:\s*)?", "", re.sub(r"\s+", " ", text))  # the prefix every line has
    first = _WORD.search(text.replace("\0", " "))
    if first is None:
        return None
    start = text.rfind(" ", 0, first.start()) + 1  # from the start of the first word's token ("--gpu", "(no")
    key, words = "", 0
    for token in re.split(r"( )", text[start:]):
        if words >= KEY_WORDS:
            break
        key += token
        words += bool(_WORD.search(token.replace("\0", " ")))
    key = key.rstrip("\0 ").rstrip(" .,:;(\0")
    return key.replace("\0", "…") if words >= MIN_WORDS else None


def pattern(key: str) -> re.Pattern:
    """How the page is searched for `key`: its fixed text, whitespace and case folded, each '…' a wildcard."""
    parts = [re.escape(" ".join(piece.split())).replace(r"\ ", r"\s+") for piece in key.split("…")]
    return re.compile(WILDCARD.join(parts), re.IGNORECASE | re.DOTALL)


def page_text(path: str = PAGE) -> str:
    """The page as the keys are matched against: its words, without Markdown's backticks, bold and escapes."""
    text = open(path, encoding="utf-8").read().replace("`", "").replace("**", "").replace("\\", "")
    return " ".join(text.split())


class _Module:
    def __init__(self, path: str) -> None:
        self.path = path
        self.where = os.path.relpath(path, REPO)
        self.dotted = self.where[:-3].replace(os.sep, ".").removesuffix(".__init__")
        self.tree = ast.parse(open(path, encoding="utf-8").read())
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.assigned = {t.id: n.value for n in self.tree.body if isinstance(n, ast.Assign)
                         for t in n.targets if isinstance(t, ast.Name)}
        self.imported = {alias.asname or alias.name: (n.module, alias.name) for n in ast.walk(self.tree)
                         if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("autofit")
                         for alias in n.names}

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None


class MessageSites:
    """The package's message sites (`sites`), read once from its source."""

    def __init__(self, root: str = PACKAGE) -> None:
        self.modules = [_Module(os.path.join(folder, name)) for folder, _, names in os.walk(root)
                        for name in sorted(names) if name.endswith(".py")]
        self.by_dotted = {m.dotted: m for m in self.modules}
        self.functions: dict[str, list[tuple[_Module, ast.FunctionDef]]] = {}
        for module in self.modules:
            for node in ast.walk(module.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, []).append((module, node))
        self.errors = self._error_classes()
        self.wrappers = self._wrappers()

    # --- what says something -------------------------------------------------------------------------------
    def _error_classes(self) -> set[str]:
        """Exception classes by name: builtin, click's, and the package's own, however deep they derive."""
        known = _BUILTIN_ERRORS | CLICK_ERRORS
        classes = [n for m in self.modules for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef)]
        while True:
            more = {c.name for c in classes if c.name not in known and any(_name(b) in known for b in c.bases)}
            if not more:
                return known
            known |= more

    def _said(self, call: ast.Call, module: _Module) -> tuple[str, ast.AST] | None:
        """(kind, the expression said) where `call` says something."""
        name = _name(call.func)
        receiver = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""
        first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("message", "msg")),
                                                   None)
        if name in self.errors:
            return (f"raise {name}", first) if first is not None else None
        if name == "warn" and receiver in ("", "warnings"):
            return ("warning", first) if first is not None else None
        if name in _ECHO and receiver in ("", "click") or \
                name == "fail" and receiver in ("self", "ctx") and "cli" in module.dotted:  # click's ParamType.fail
            return ("echo", first) if first is not None else None
        if name == "write" and re.search(r"stderr|stream", receiver) and call.args:
            return "echo", call.args[0]
        if name == "note" and call.args:
            return "note", call.args[0]
        if name in ("append", "extend", "insert") and re.search(r"(^|[._])notes$", receiver):
            return "note", call.args[-1] if call.args else None
        if name in _LOG and re.search(r"log", receiver):
            return ("warning", first) if first is not None else None
        carried = next((k for k in call.keywords if k.arg == "note" or (k.arg or "").endswith("message")), None)
        if carried is not None and name != "filterwarnings":  # a record's text, printed from its field
            return ("note" if carried.arg == "note" else "echo"), carried.value
        wrapped = next((self.wrappers[id(f)] for _, f in self._defined(name, module) if id(f) in self.wrappers), None)
        if wrapped is not None:
            kind, position, keyword = wrapped
            given = call.args[position] if len(call.args) > position else \
                next((k.value for k in call.keywords if k.arg == keyword), None)
            return (kind, given) if given is not None else None
        return None

    def _wrappers(self) -> dict[int, tuple[str, int, str]]:
        """Functions that pass a parameter on to what says something: id of the function's node -> (kind, the
        parameter's position, its name)."""
        found: dict[int, tuple[str, int, str]] = {}
        self.wrappers = found
        while True:
            before = dict(found)
            for module in self.modules:
                for call in (n for n in ast.walk(module.tree) if isinstance(n, ast.Call)):
                    said = self._said(call, module)
                    function = module.function_of(call)
                    if said is None or said[1] is None or function is None:
                        continue
                    params = [a.arg for a in function.args.args]
                    passed = _passed_on(said[1])
                    if passed in params and passed not in ("self", "cls") and id(function) not in found:
                        offset = 1 if params[:1] in (["self"], ["cls"]) else 0
                        found[id(function)] = (said[0], params.index(passed) - offset, passed)
            if found == before:
                return found

    # --- what it says ---------------------------------------------------------------------------------------
    def sites(self) -> list[Site]:
        found = []
        for module in self.modules:
            for node in ast.walk(module.tree):
                for kind, expr in self._said_at(node, module):
                    for template in self.templates(expr, module, module.function_of(node)):
                        found.append(Site(f"{module.where}:{node.lineno}", kind, template))
        return found

    def _said_at(self, node: ast.AST, module: _Module) -> Iterator[tuple[str, ast.AST]]:
        if isinstance(node, ast.Call):
            said = self._said(node, module)
            if said is not None and said[1] is not None:
                yield said
            for keyword in node.keywords:
                if keyword.arg == "notes":
                    yield "note", keyword.value
        elif isinstance(node, (ast.AugAssign, ast.Assign)):
            targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
            for target in targets:
                if isinstance(target, (ast.Name, ast.Attribute)) and _name(target) == "message":
                    yield "echo", node.value
                named = target.value if isinstance(target, ast.Subscript) else target
                if isinstance(named, (ast.Name, ast.Attribute)) and re.search(r"(^|_)notes$", _name(named) or "") \
                        and (isinstance(node, ast.AugAssign) or isinstance(target, ast.Subscript)):
                    yield "note", node.value

    def templates(self, expr: ast.AST | None, module: _Module, function, depth: int = 0,
                  index: int | None = None) -> list[Template]:
        """Each text `expr` can be, as fixed parts and placeholders (`index`: of the tuple it is)."""
        if expr is None or depth > 16:
            return [(None,)]
        again = lambda e, i=None: self.templates(e, module, function, depth + 1, i)  # noqa: E731
        if isinstance(expr, ast.Tuple) and index is not None:
            return again(expr.elts[index]) if index < len(expr.elts) else [(None,)]
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return [t for e in expr.elts for t in again(e)]
        if isinstance(expr, ast.Constant):
            return [(expr.value,)] if isinstance(expr.value, str) else [(None,)]
        if isinstance(expr, ast.JoinedStr):
            found: list[Template] = [()]
            for position, value in enumerate(expr.values):
                parts = self._spliced(value, module, function, depth, leading=position == 0)
                found = [a + b for a in found for b in parts][:64]
            return found
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return [a + b for a in again(expr.left) for b in again(expr.right)][:64]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            return again(expr.left)
        if isinstance(expr, ast.IfExp):
            return again(expr.body, index) + again(expr.orelse, index)
        if isinstance(expr, ast.BoolOp):
            return [t for value in expr.values for t in again(value, index)]
        if isinstance(expr, (ast.GeneratorExp, ast.ListComp)):
            return again(expr.elt)
        if isinstance(expr, ast.Starred):
            return again(expr.value)
        if isinstance(expr, ast.Subscript):
            if isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, int):
                return again(expr.value, expr.slice.value)
            return [(None,)]
        if isinstance(expr, ast.Name):
            return self._name_templates(expr.id, module, function, depth, index)
        if isinstance(expr, ast.Call):
            return self._call_templates(expr, module, function, depth, index)
        return [(None,)]

    def _spliced(self, value: ast.AST, module: _Module, function, depth: int, leading: bool) -> list[Template]:
        """An f-string's part: its text; a name's texts where the name leads it (`f"{why}; the worker was
        replaced"`: the family is `why`'s); a constant's text (`{UNCONFIRMED_BUDGET}`); else a placeholder."""
        if isinstance(value, ast.Constant):
            return [(value.value,)]
        if isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.format_spec is None:
            found = self._name_templates(value.value.id, module, function if leading else None, depth + 1, None)
            if leading or all(len(t) == 1 and t[0] is not None for t in found):
                return found
        return [(None,)]

    def _name_templates(self, name: str, module: _Module, function, depth: int, index) -> list[Template]:
        found: list[Template] = []
        for node in ast.walk(function) if function is not None else ():  # a function's own names, then globals
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        found += self.templates(node.value, module, function, depth + 1, index)
                    elif isinstance(target, ast.Tuple):
                        for position, element in enumerate(target.elts):
                            if isinstance(element, ast.Name) and element.id == name:
                                found += self.templates(node.value, module, function, depth + 1, position)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) \
                    and node.target.id == name and node.value is not None:
                found += self.templates(node.value, module, function, depth + 1, index)
        if found:
            return found
        for _ in range(4):  # a module's own constant, or one imported (through a package's re-export)
            if name in module.assigned:
                return self.templates(module.assigned[name], module, None, depth + 1, index)
            source, name = module.imported.get(name, (None, name))
            module = self.by_dotted.get(source)
            if module is None:
                break
        return [(None,)]

    def _call_templates(self, call: ast.Call, module: _Module, function, depth: int, index) -> list[Template]:
        name = _name(call.func)
        if isinstance(call.func, ast.Attribute) and name in _STR_METHODS:
            return self.templates(call.func.value, module, function, depth + 1, index)
        found: list[Template] = []
        for owner, defined in self._defined(name, module):
            for node in ast.walk(defined):
                if isinstance(node, ast.Return) and node.value is not None and owner.function_of(node) is defined:
                    found += self.templates(node.value, owner, defined, depth + 1, index)
        return found or [(None,)]

    def _defined(self, name: str | None, caller: _Module) -> list[tuple[_Module, ast.FunctionDef]]:
        """The package's functions `name` may call: the caller's own module's, else those of the modules and
        subpackages it imports from, else any of that name."""
        candidates = self.functions.get(name or "", [])
        own = [c for c in candidates if c[0] is caller]
        sources = {source for source, _ in caller.imported.values()}
        imported = [c for c in candidates if any(c[0].dotted == s or c[0].dotted.startswith(s + ".") for s in sources)]
        return own or imported or candidates

    @cached_property
    def families(self) -> dict[str, list[Site]]:
        """Each family's key, with its sites."""
        grouped: dict[str, list[Site]] = {}
        for site in self.sites():
            if site.key is not None:
                grouped.setdefault(site.key, []).append(site)
        return grouped


def _passed_on(expr: ast.AST) -> str | None:
    """The name whose text `expr` says, where nothing else in it has words ("autofit: " aside): `text`,
    `"\\r" + text + "\\n"`, `f"autofit: {message}"`; else None."""
    if isinstance(expr, ast.Name):
        return expr.id
    parts = [expr.left, expr.right] if isinstance(expr, ast.BinOp) else \
        [v.value if isinstance(v, ast.FormattedValue) else v for v in expr.values] if isinstance(expr, ast.JoinedStr) \
        else []
    names = [p.id for p in parts if isinstance(p, ast.Name)]
    rest = [p for p in parts if not isinstance(p, ast.Name)]
    plain = all(isinstance(p, ast.Constant) and isinstance(p.value, str)
                and not _WORD.search(p.value.replace("autofit:", "")) for p in rest)
    if isinstance(expr, ast.BinOp) and not names:
        inner = [_passed_on(p) for p in parts if isinstance(p, ast.BinOp)]
        names = [n for n in inner if n]
        rest = [p for p in parts if not isinstance(p, ast.BinOp)]
        plain = all(isinstance(p, ast.Constant) and isinstance(p.value, str) and not _WORD.search(p.value)
                    for p in rest)
    return names[0] if len(names) == 1 and plain else None


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return None


def printed_key(line: str) -> str | None:
    """The family key of a line as autofit printed it (a log's `note: trial 0: worker memory stayed 338.00 MiB
    above ...`): its prefixes dropped, each figure (with its unit) a placeholder."""
    text = re.sub(r"^(note:\s*)?(autofit:\s*)?(error:\s*)?(trial \d+:\s*)?", "", line.strip())
    text = re.sub(r"\S*\d\S*(\s+(B|KiB|MiB|GiB|s|%)(?=\s|$))?", "\0", text)
    return family_key(tuple(None if part == "\0" else part for part in re.split(r"(\0)", text) if part))


def explained(key: str, page: str) -> bool:
    """Whether `page` (page_text's) quotes the family of `key`."""
    return pattern(key).search(page) is not None
