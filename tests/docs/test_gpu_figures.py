"""Every GPU figure in the README and the docs names its log (issue 54, item 6): a sentence that names a GPU
and gives a figure (a rate, a time, memory, a ratio, a percentage) sits in a paragraph, a list item or a table
(its caption, the paragraph above it, counts) that names its source: a log or file under
benchmarks/gpu/results/ (which must exist), the shared GPU logs (../shared/gpu/...), the forecast's dated
tables (autofit/forecast/_gpus.py, _prices.py), the datasheets' peaks (autofit/devices/_peak_flops.py), the
published figures benchmarks/forecast.py records, or a published source's address. A GPU figure no one can
trace is one no one can check: docs/limits.md's "±15%" turned out to be 3.5-33% in its log. Commands in
backticks (`--memory 24GiB`) hold values, not figures."""

from __future__ import annotations

import os
import re

from tests.support import REPO

GPU = re.compile(r"\b(H100|H200|A100|A10G?|L40S?|L4|T4|V100|B200|GH200|RTX ?\d{4})\b")
FIGURE = re.compile(r"(?<![-\w])\d[\d,.]*(\s?(%|x\b|s\b|ms\b|samples/s|tokens/s|tok/s|TFLOP|J/sample)|\s(GiB|MiB))"
                    r"|MFU \d")
SOURCE = re.compile(r"benchmarks/gpu/results/[\w.-]+|shared/gpu/[\w.-]+|https?://\S+"
                    r"|autofit/forecast/_(gpus|prices)\.py|benchmarks/forecast\.py|autofit/devices/_peak_flops\.py")
COMMAND = re.compile(r"`[^`]*--[^`]*`")
SENTENCE = re.compile(r"(?<=[.!?;])\s+(?=[A-Z(`*\"])")


def _units(text: str) -> list[tuple[int, str, str]]:
    """(first line, text, context) of each paragraph and list item outside code blocks, and of each table row,
    whose context is the paragraph above its table (its caption, which may name the source)."""
    found: list[tuple[int, str, str]] = []
    lines: list[str] = []
    start, code, caption = 0, False, ""

    def close() -> None:
        if lines:
            found.append((start, " ".join(lines), ""))
            lines.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            code = not code
            close()
            continue
        if code:
            continue
        if line.lstrip().startswith("|"):
            close()
            found.append((number, line, caption))
            continue
        if not line.strip() or line.startswith("#") or re.match(r"\s*([-*]|\d+\.) ", line):
            close()
            if not line.strip() or line.startswith("#"):
                continue
        if not lines:
            start = number
        lines.append(line)
        caption = " ".join(lines)
    close()
    return found


def _untraced(text: str) -> list[tuple[int, str]]:
    """(line, the first sentence with a GPU figure) of each unit of `text` that names no source."""
    found = []
    for line, unit, context in _units(text):
        figures = [s for s in SENTENCE.split(COMMAND.sub("", unit)) if GPU.search(s) and FIGURE.search(s)]
        if figures and not SOURCE.search(f"{unit} {context}"):
            found.append((line, " ".join(figures[0].split())[:160]))
    return found


def _pages() -> list[str]:
    docs = os.path.join(REPO, "docs")
    return [os.path.join(REPO, "README.md"), *sorted(os.path.join(folder, name) for folder, _, names in os.walk(docs)
                                                     for name in names if name.endswith(".md"))]


def test_every_gpu_figure_names_its_log():
    untraced = [f"{os.path.relpath(page, REPO)}:{line}: {sentence}" for page in _pages()
                for line, sentence in _untraced(open(page, encoding="utf-8").read())]
    assert not untraced, "name the log of each GPU figure (benchmarks/gpu/results/...):\n" + "\n".join(untraced)


def test_every_log_a_page_names_exists():
    missing = [f"{os.path.relpath(page, REPO)}: {path}" for page in _pages()
               for path in re.findall(r"benchmarks/gpu/results/[\w.-]*\w", open(page, encoding="utf-8").read())
               if not os.path.exists(os.path.join(REPO, path))]
    assert not missing, "\n".join(missing)


def test_a_figure_without_its_log_is_found():
    text = ("Intro.\n\nOn an H100 a probe took 47 s; `--memory 80GiB` is a value.\n\nThe rates:\n\n| gpu | rate |\n"
            "|---|---|\n| H100 | 475.7 samples/s |\n")
    assert [line for line, _ in _untraced(text)] == [3, 9]
    cited = text.replace("The rates:", "The rates (benchmarks/gpu/results/x.log):")
    assert [line for line, _ in _untraced(cited)] == [3]  # a table's caption names the source of its rows
