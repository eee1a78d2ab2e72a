"""The table "One name per quantity" in CONTRIBUTING.md stays true where a machine can check it: each CLI
flag is in its command's --help, each decorator name is an argument of @autofit or a SearchOptions field,
each Config name is on Config, and each best-config JSON field is in an exported file."""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
import re

import pytest
from click.testing import CliRunner

from autofit import Config, SearchOptions, autofit
from autofit.cli import cli
from autofit.config import CONSIDERED
from autofit.export import MeasuredFigures, ScriptEntry, config_entry, read_best
from tests.support import REPO

COMMANDS = ("probe", "search", "estimate")


def _rows() -> list[dict[str, str]]:
    text = open(os.path.join(REPO, "CONTRIBUTING.md"), encoding="utf-8").read()
    section = text.split("## One name per quantity", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


ROWS = _rows()


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_table_has_a_row_for_each_quantity_the_issue_names():
    quantities = " ".join(row["quantity"] for row in ROWS)
    for word in ("memory limit", "usable memory", "micro-batch", "search range", "accumulation", "global batch",
                 "checkpoint segments", "checkpoint policy", "precision", "loader workers", "parallel probes",
                 "peak bytes", "peak FLOP/s"):
        assert word in quantities, word


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["quantity"][:30])
def test_each_cli_flag_is_in_the_help_of_its_commands(row):
    cell = row["CLI flag"]
    for part in re.split(r",\s*(?=`)", cell):
        flags = re.findall(r"`(--[a-z-]+)`", part)
        named = [c for c in COMMANDS if re.search(rf"\b{c}\b", part.split("(", 1)[-1])] if "(" in part else []
        for flag in flags:
            helps = {c: CliRunner().invoke(cli, [c, "--help"]).output for c in (named or COMMANDS)}
            where = [c for c, text in helps.items() if re.search(rf"{re.escape(flag)}\b(?!-)", text)]
            assert where == list(named) if named else where, f"{flag} ({row['quantity']}): in {where}"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["quantity"][:30])
def test_each_decorator_name_is_an_argument_of_autofit_and_a_field_of_search_options(row):
    """A knob whose values a search takes a list of (CONSIDERED) is held in SearchOptions.consider by its name."""
    arguments = set(inspect.signature(autofit).parameters) - {"fn", "batch_size"}  # batch_size: the old name
    fields = {f.name for f in dataclasses.fields(SearchOptions)} - {"extra", "consider"} | {k.name for k in CONSIDERED}
    for name in _names(row["decorator / SearchOptions"]):
        assert name in arguments and name in fields, name


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["quantity"][:30])
def test_each_config_name_is_on_config(row):
    for name in re.findall(r"`Config\.([a-z_]+)`", row["Config / code"]):
        assert hasattr(Config(batch_size=8), name), name


def _exported_fields() -> set[str]:
    """Every dotted field of the exported files bundled with autofit, and of a config entry with every
    field set (distributed, so the fields only such files hold are written)."""
    documents = [read_best(path).to_dict() for path in glob.glob(os.path.join(REPO, "autofit", "recorded", "*.best.json"))]
    assert documents
    everything = Config(batch_size=24, precision="bf16", checkpoint_segments=2, accumulation_steps=3, sharding="fsdp", compile=True, loader_workers=4, pin_memory=True, prefetch_factor=4, checkpoint_policy="selective", max_tokens=64, offload_activations=True, pad_multiple=64, sdpa_backend="flash")
    documents.append({"config": config_entry(everything, world_size=2)})
    # and the figures only a CUDA search's file holds (the bundled searches ran on a CPU)
    documents.append({"measured": MeasuredFigures(alloc_retries=0, host_pinned_bytes=2**30).to_dict()})
    # the script's code and local modules, which files from studies recorded before them lack
    documents.append({"script": ScriptEntry(code_sha256="0" * 64, modules={"helper.py": "1" * 64}).to_dict()})
    found: set[str] = set()

    def walk(value, prefix: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                found.add(prefix + key)
                walk(inner, prefix + key + ".")

    for document in documents:
        walk(document, "")
    return found


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["quantity"][:30])
def test_each_json_field_is_in_an_exported_file(row):
    fields = _exported_fields()
    for name in _names(row["best-config JSON field"]):
        assert name in fields, name
