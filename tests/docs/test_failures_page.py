"""Every message autofit raises to the user, and every end-of-search explanation, is on the failures page
(docs/guide/failures.md), so a new message cannot ship unexplained (issue 45, item 3).

A message is found by its words: the first fixed part of its text (an f-string's literal parts) of at least
MIN_WORDS_CHARS characters, where a reader starts (the rule it states), compared with the page with whitespace
folded. A message whose fixed words are all shorter (`f"The {name} must be {bound}, but got {value}."`) says
nothing a page could be searched for, and is left out; so is one built elsewhere and raised by its name.
"""

from __future__ import annotations

import ast
import os

from tests.support import REPO

PAGE = os.path.join(REPO, "docs", "guide", "failures.md")
RAISED = {"UsageError", "NoFeasibleConfig", "UserCodeError", "StorageError", "ConfigFileError", "WorkerStartError",
          "AutofitError", "NothingOnDevice"}
#: Functions whose returned text is a search's last word (an end-of-search explanation).
EXPLANATIONS = {("autofit/findings/_explain.py", "nothing_fits")}
MIN_WORDS_CHARS = 12


def _fixed_parts(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [value.value for value in node.values if isinstance(value, ast.Constant)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _fixed_parts(node.left) + _fixed_parts(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # f"...".rstrip()
        return _fixed_parts(node.func.value)
    return []


def _words(node: ast.AST) -> str:
    parts = [" ".join(part.split()).strip(" .:;,") for part in _fixed_parts(node)]
    return next((part for part in parts if len(part) >= MIN_WORDS_CHARS), "")


def _messages() -> dict[str, str]:
    """Each message's fixed words, with where it is raised."""
    found: dict[str, str] = {}
    for root, _, files in os.walk(os.path.join(REPO, "autofit")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            where = os.path.relpath(path, REPO)
            tree = ast.parse(open(path, encoding="utf-8").read())
            for node in ast.walk(tree):
                texts: list[ast.AST] = []
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                    called = node.exc.func
                    if (called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)) in RAISED:
                        texts.append(node.exc.args[0])
                if isinstance(node, ast.FunctionDef) and (where, node.name) in EXPLANATIONS:
                    texts += [n for n in ast.walk(node) if isinstance(n, ast.JoinedStr)]  # every f-string it says
                for text in texts:
                    words = _words(text)
                    if len(words) >= MIN_WORDS_CHARS:
                        found.setdefault(words, f"{where}:{getattr(text, 'lineno', '?')}")
    return found


def test_the_search_finds_the_messages_it_checks():
    messages = _messages()
    assert len(messages) > 60  # the walk sees the package's raises (a broken walk would pass the next test)
    assert any("Nothing fits under" in words for words in messages)  # the end-of-search explanations too


def test_every_message_is_explained_on_the_failures_page():
    page = " ".join(open(PAGE, encoding="utf-8").read().split())
    missing = sorted(f"{where}: {words!r}" for words, where in _messages().items() if words not in page)
    assert not missing, "explain these on docs/guide/failures.md:\n" + "\n".join(missing)
