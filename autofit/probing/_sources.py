"""A script's version, as a search tells its probes apart and a normal run checks its best-config file: the
script's code and the code of each local module its probes loaded.

The code is the file's tokens (`code_sha256`), not its bytes: a comment, a blank line, the indentation's
width, line breaks inside brackets and docstrings (a statement that is a string alone) leave it alone, so a
comment added to a script keeps every probe a study measured; anything Python runs changes it. Docstrings
count as comments: a training script that builds its model from `__doc__` is not one autofit has met, and a
reworded docstring dropping every probe is one it has. A file that does not tokenize is hashed as its bytes.
Another Python version may tokenize an f-string into other pieces (3.12 splits them): its hashes compare with
its own only.

A local module is one whose file lies under the script's project (the nearest folder above the script that
holds .git, pyproject.toml, setup.py or setup.cfg; else the script's own folder) and outside the environment
(site-packages, the interpreter's prefixes) and autofit: `helper.py` beside `train.py`, a `models/` package
of the project. They are found in the probe's process, from the modules actually loaded when the probe ends
(`local_modules`), so an import inside the training function counts too; each is named by its path from the
project's root. The search reads them again (`ScriptVersion`) to see which changed since a probe ran.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import sysconfig
import tokenize
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from autofit.export import script_sha256

#: What marks a project's root: the folder whose modules are the script's own.
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
#: Tokens that carry no code: comments, the breaks between lines inside brackets, the encoding's marker.
_LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER)
_AUTOFIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: A file's code_sha256 by (path, size, mtime): a process reads each file once while it is unchanged.
_read: dict[tuple[str, int, int], str | None] = {}


def code_sha256(path: str) -> str | None:
    """The sha256 of a Python file's code (its tokens, layout, comments and docstrings aside); of its bytes
    where it does not tokenize; None where it cannot be read."""
    try:
        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key not in _read:
            with open(path, "rb") as handle:
                _read[key] = _digest(handle.read())
        return _read[key]
    except OSError:
        return None


def _digest(source: bytes) -> str:
    try:
        words = list(_code_words(source))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        return hashlib.sha256(source).hexdigest()
    return hashlib.sha256("\x00".join(words).encode()).hexdigest()


def _code_words(source: bytes) -> Iterator[str]:
    """The tokens that make the code, an indent or dedent as a word of its own whatever its width; a logical
    line of strings alone (a docstring, or a string used as a comment) left out."""
    line: list[tokenize.TokenInfo] = []
    for token in tokenize.tokenize(io.BytesIO(source).readline):
        if token.type in _LAYOUT:
            continue
        if token.type in (tokenize.INDENT, tokenize.DEDENT):
            yield "<indent>" if token.type == tokenize.INDENT else "<dedent>"
        elif token.type == tokenize.NEWLINE:
            if not all(t.type == tokenize.STRING for t in line):
                yield from (t.string for t in line)
                yield "<newline>"
            line = []
        else:
            line.append(token)
    yield from (t.string for t in line)


def project_root(script: str) -> str:
    """The folder a script's local modules lie under: the nearest above it that marks a project, else its own."""
    start = folder = os.path.dirname(os.path.realpath(script))
    while True:
        if any(os.path.exists(os.path.join(folder, marker)) for marker in PROJECT_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return start
        folder = parent


def _environment() -> tuple[str, ...]:
    """Folders whose modules are never the script's own: the interpreter's, its libraries', autofit's."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, _AUTOFIT_DIR}
    paths |= {p for name in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(name))}
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def local_modules(script: str, modules: Mapping[str, object] | None = None) -> dict[str, str]:
    """The script's local modules among those loaded (`sys.modules`), each path from the project's root to its
    code_sha256, sorted: what a probe records of the code it ran beside the script's own."""
    root = project_root(script) + os.sep
    own, outside = os.path.realpath(script), _environment()
    found: dict[str, str] = {}
    for module in list((modules if modules is not None else sys.modules).values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        path = os.path.realpath(path)
        if path == own or not path.startswith(root) or path.startswith(outside):
            continue
        if {"site-packages", "dist-packages"} & set(path.split(os.sep)):
            continue
        digest = code_sha256(path)
        if digest is not None:
            found[os.path.relpath(path, root)] = digest
    return dict(sorted(found.items()))


@dataclass
class RecordedVersion:
    """A version as a study or a best-config file recorded it: the script's bytes' sha256 (what studies and files
    kept before the code's), its code's, and its local modules' code. Compared with a probe's record by
    `changes`: a module it did not record is not known, and not counted as changed."""

    sha256: str | None = None
    code_sha256: str | None = None
    modules: Mapping[str, str | None] = field(default_factory=dict)
    name: str = "the script"

    def module(self, path: str) -> tuple[bool, str | None]:
        """(known, its code_sha256) of a local module by its path from the project's root."""
        return (path in self.modules, self.modules.get(path))

    def changes(self, sha256: str | None, code: str | None, modules: Mapping[str, str] | None) -> list[str]:
        """What differs between this version and a recorded one (a probe's stamps, a file's script entry): the
        script's name where its code differs (its bytes where either has no code's hash; neither: not known,
        not changed), then each module whose code differs (`path (gone)` for one no longer there). Empty:
        the same version, as far as both know."""
        changed = []
        if code and self.code_sha256:
            if code != self.code_sha256:
                changed.append(self.name)
        elif sha256 and self.sha256 and sha256 != self.sha256:
            changed.append(self.name)
        for path, digest in sorted((modules or {}).items()):
            known, now = self.module(path)
            if known and now != digest:
                changed.append(path if now is not None else f"{path} (gone)")
        return changed


@dataclass
class ScriptVersion(RecordedVersion):
    """The version of a script on this machine now: its files read on first need, then kept (one reading per
    search: a file edited during it does not split its probes)."""

    script: str = ""
    root: str = ""

    @classmethod
    def of(cls, script: str) -> ScriptVersion:
        return cls(sha256=script_sha256(script), code_sha256=code_sha256(script), modules={},
                   name=os.path.basename(script), script=script, root=project_root(script))

    def module(self, path: str) -> tuple[bool, str | None]:
        if path not in self.modules:
            self.modules[path] = code_sha256(os.path.join(self.root, path))
        return True, self.modules[path]

    def known(self, paths) -> dict[str, str]:
        """The code_sha256 now of each module of `paths` (and of those read before) that is there."""
        for path in paths:
            self.module(path)
        return {path: digest for path, digest in sorted(self.modules.items()) if digest is not None}
