"""`.. autofit-knobs::`: the table of a config's fields, rendered from their declaration (autofit.config.KNOBS), so
the best-config reference page cannot drift from the code: each knob's name, type, values, default, whether a
config's JSON always holds it, its help, its probe flag and, for a knob a search takes a list of, the search's."""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import Directive

from autofit.config import KNOBS


def _values(knob) -> str:
    if knob.kind is bool:
        return "true, false"
    if knob.kind is str:
        return ", ".join(knob.choices)
    low = f"{knob.minimum if knob.minimum is not None else 0} or more"
    return f"{low} (a search tries {', '.join(map(str, knob.choices))})" if knob.choices else low


def _default(knob) -> str:
    if knob.default is None and not knob.optional:
        return "required"
    if knob.default is None:
        return "none (as the script declares)" if knob.offer == "loader" else "none"
    return str(knob.default).lower() if isinstance(knob.default, bool) else str(knob.default)


def _row(cells: list[str | nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        paragraph = nodes.paragraph()
        paragraph += nodes.Text(cell) if isinstance(cell, str) else cell
        entry += paragraph
        row += entry
    return row


class KnobTable(Directive):
    """A table with one row per knob, in a label's order."""

    def run(self) -> list[nodes.Node]:
        header = ["config field", "type", "values", "default", "in the file", "what it is", "flags"]
        table, group = nodes.table(), nodes.tgroup(cols=len(header))
        table += group
        for _ in header:
            group += nodes.colspec(colwidth=1)
        head, body = nodes.thead(), nodes.tbody()
        head += _row(header)
        for knob in KNOBS:
            kind = knob.kind.__name__ + (" or null" if knob.optional else "")
            flags = f"probe {knob.cli_flag}" + (f"; search {knob.cli_flag} A,B" if knob.consider else "")
            body += _row([nodes.literal(text=f"config.{knob.name}"), kind, _values(knob), _default(knob),
                          "always" if knob.stored else "when not the default", knob.help, nodes.literal(text=flags)])
        group += head
        group += body
        return [table]


def setup(app) -> dict:
    app.add_directive("autofit-knobs", KnobTable)
    return {"parallel_read_safe": True}
