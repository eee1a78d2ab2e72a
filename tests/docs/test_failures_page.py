"""Every message autofit says, of every kind, is explained on the failures page (docs/guide/failures.md), so
that a new message cannot ship unexplained (issue 54, item 3; issue 45 checked what 8 exception classes raise).

tests/support/message_sites.py walks the package's source for every site that says something (a raise of any
exception built with a message, a warning, a line echoed or printed, a note) and gives each text its family's
key: its leading fixed words, placeholders kept as wildcards. The page explains a family when it quotes those
words (a placeholder written `...`, `N`, `X` or as an example). A message added on another branch is a new
family unless its leading words are an existing family's; its failure here names the key, the site and what
to add."""

from __future__ import annotations

import os
import re

from tests.support import REPO
from tests.support.message_sites import PAGE, MessageSites, explained, page_text, printed_key

HOW = ("Explain each family below on docs/guide/failures.md: quote its leading words as given (each … is a "
       "placeholder: write ..., N or X there, or an example), then say what it means and what to do. A message that "
       "only a bug of autofit's can raise goes under \"A bug of autofit's\". Keys are the first words of the message "
       "(tests/support/message_sites.py): rewording its tail keeps its entry; new leading words need their own.")


def test_the_walk_finds_every_kind_of_site():
    sites = MessageSites().sites()
    kinds = {site.kind.split()[0] for site in sites}
    assert {"raise", "warning", "echo", "note"} <= kinds
    assert len({site.key for site in sites if site.key}) > 200  # a broken walk would pass the next test
    keys = {site.key for site in sites}
    for expected in ("Nothing fits under … usable (… limit",
                     "worker memory stayed … above what it",  # a note whose words come from the function it calls
                     "is unconfirmed: the budget left no",  # a constant spliced into its f-string
                     "The TrainingArguments ask for a global",  # a builtin exception's message
                     "the allocator settings differ from the",  # a warning through the normal run's _warn
                     "memory estimator: estimating … (fake tensors"):  # a reporter's note through a wrapper
        assert any(key and key.startswith(expected) for key in keys), expected


def test_a_new_message_of_any_kind_is_a_new_family(tmp_path):
    """What another branch's new message meets: its family is found, whatever says it."""
    package = tmp_path / "autofit"
    package.mkdir()
    (package / "mod.py").write_text(
        "import warnings\n"
        "from autofit.errors import UsageError\n"
        "WHY = 'because the frobnicator is cold'\n"
        "def _say(message):\n    warnings.warn(message)\n"
        "def run(x, notes):\n"
        "    if x:\n        raise UsageError(f'The frob count must be positive, but got {x}.')\n"
        "    _say('the widget was replaced in flight')\n"
        "    why = f'gizmo {x} stalled twice in a row'\n"
        "    notes.append(f'{why}; the probe ran again')\n"
        "    notes.append(f'{x} is unsteady: {WHY}')\n"
        "    print(f'autofit: the sprocket ran {x} laps', file=sys.stderr)\n"
        "    return Record(error_message=f'The spindle broke after {x} turns')\n")
    keys = {site.key: site.kind for site in MessageSites(str(package)).sites() if site.key}
    assert keys == {"The frob count must be positive": "raise UsageError",
                    "the widget was replaced in flight": "warning", "gizmo … stalled twice in a row": "note", "is unsteady: because the frobnicator is": "note",
                    "the sprocket ran … laps": "echo", "The spindle broke after … turns": "echo"}


def test_every_message_family_is_explained_on_the_failures_page():
    page = page_text()
    missing = [f"  {key!r}: {', '.join(sorted({f'{s.kind} at {s.where}' for s in sites}))}"
               for key, sites in sorted(MessageSites().families.items()) if not explained(key, page)]
    assert not missing, f"{HOW}\n" + "\n".join(missing)


def _sample_notes() -> list[tuple[str, str]]:
    """Every `note:` line the README and the docs show as output, with where."""
    found = []
    for path in [os.path.join(REPO, "README.md"), *(os.path.join(folder, name) for folder, _, names in
                                                    os.walk(os.path.join(REPO, "docs")) for name in names
                                                    if name.endswith(".md"))]:
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            if re.match(r"\s*note: ", line):
                found.append((f"{os.path.relpath(path, REPO)}:{number}", line.strip()))
    return found


def test_every_note_the_pages_show_is_explained_on_the_failures_page():
    """The notes of the README's sample output (an H100's log, as it printed them) and of the guide's pages."""
    page, notes = page_text(), _sample_notes()
    assert any("worker memory stayed" in line for _, line in notes)  # the README's sample output is read
    unexplained = [f"{where}: {line}" for where, line in notes if not explained(printed_key(line), page)]
    assert not unexplained, "explain these on docs/guide/failures.md:\n" + "\n".join(unexplained)


def test_the_page_is_the_one_the_walk_reads():
    assert PAGE == os.path.join(REPO, "docs", "guide", "failures.md")
