"""Every default `--help` states is the code's, and docs/reference/cli.md shows no other (issue 45, item 4):
a click default shown in the help and a default stated in words ("(default: full,selective)") agree with
the value the page's synopsis gives the same option; the device's default is what the code does.

Every default stated in words is checked against the code that makes it (issue 54, item 6: `--memory-limit`
said "(default: the whole device)" while a CPU search took the memory free, 20.75 of 23.54 GiB): WORDED has a
check per option, and an option whose help states a default in words without one fails here."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re

import click
import pytest

from autofit.cli import cli
from tests.support import REPO

PAGE = os.path.join(REPO, "docs", "reference", "cli.md")
COMMANDS = ("search", "probe", "estimate")


def _synopsis_values(command: str) -> dict[str, str]:
    """`--flag VALUE` pairs of one command's synopsis lines, the VALUE an example or a default."""
    block = open(PAGE, encoding="utf-8").read().split("```", 2)[1]
    text, current = "", None
    for line in block.splitlines():
        found = re.match(r"autofit (\w+)", line)
        current = found.group(1) if found else current
        if current == command:
            text += " " + line
    return dict(re.findall(r"(--[a-z][a-z0-9-]*) ([^\s\[\]|-][^\s\[\]|]*)", text))


def _stated_defaults(command: click.Command) -> dict[str, str]:
    """What each option's help says its default is: click's shown default, or '(default: X)' of one word."""
    stated = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or param.is_flag:
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        worded = re.search(r"\(default: ([^\s);]+)\)", param.help or "")
        if param.show_default and param.default is not None and not isinstance(param.default, (tuple, list)):
            stated[flag] = str(param.default)
        elif worded:
            stated[flag] = worded.group(1)
    return stated


@pytest.mark.parametrize("name", COMMANDS)
def test_the_pages_synopsis_gives_no_option_a_value_other_than_its_stated_default(name):
    stated, shown = _stated_defaults(cli.commands[name]), _synopsis_values(name)
    compared = {flag: value for flag, value in shown.items() if flag in stated and not value.isupper()}
    assert compared, f"nothing compared for {name}: the synopsis' form changed"
    for flag, value in compared.items():
        assert value == stated[flag], f"autofit {name} {flag}: the page shows {value}, --help says {stated[flag]}"


# --- every worded default, against the code that makes it ------------------------------------------------------

GiB = 2**30


def _worded(text: str | None) -> str | None:
    """What "(default: ...)" in `text` says, its own parentheses kept."""
    start = (text or "").find("(default: ")
    if start < 0:
        return None
    depth, end = 0, start
    for end, char in enumerate(text[start:], start):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            break
    return text[start + len("(default: "):end]


def _search_limit(words: str, monkeypatch) -> None:
    from autofit.devices import DeviceInfo, default_memory_limit

    gpu = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", 80 * GiB, 70 * GiB)
    cpu = DeviceInfo("cpu", 0, "a CPU", 24 * GiB, 20 * GiB)
    assert "a GPU's whole memory" in words and default_memory_limit(gpu) == gpu.total_bytes
    assert "on the CPU, the memory free when the search starts, shared among --parallel probes" in words
    assert default_memory_limit(cpu) == cpu.free_bytes and default_memory_limit(cpu, workers=2) == cpu.free_bytes // 2
    assert "a resumed study's own" in words  # tests/whitebox/test_resume.py: a resumed study keeps its limit


def _probe_limit(words: str, monkeypatch) -> None:
    from autofit.probing import ProbeSettings

    assert words == "no cap: the whole device"
    default = next(f.default for f in dataclasses.fields(ProbeSettings) if f.name == "memory_limit")
    assert default is None  # and a backend given no limit lifts its cap (tests/whitebox/test_device_contract.py)


def _search_probe_timeout(words: str, monkeypatch) -> None:
    budget = open(os.path.join(REPO, "autofit", "search", "_time_budget.py"), encoding="utf-8").read()
    assert "start = max(60.0, 3 * max(starts)) if starts else left" in budget  # the start: 3x, else the budget left
    assert "stall = max(60.0, 20 * max(steps))" in budget  # the steps: 20x the slowest
    assert words.startswith("the first start gets the budget left, later ones 3x the longest seen; steps 20x the "
                            "slowest seen; 60 s at least")


def _probe_timeout(words: str, monkeypatch) -> None:
    from autofit.units import parse_duration

    probe = inspect.unwrap(cli.commands["probe"].callback)
    assert "PROBE_TIMEOUT_S" in inspect.getsource(probe)  # what the probe takes without --probe-timeout
    assert parse_duration(words) == probe.__globals__["PROBE_TIMEOUT_S"]


def _storage(words: str, monkeypatch) -> None:
    from autofit.study import bundled_storage_url, default_storage_url, storage_exists

    first, _, rest = words.partition(", else ")
    monkeypatch.chdir(monkeypatch.tmp)  # a relative sqlite path, in the working directory
    assert first.startswith("sqlite:///") and default_storage_url() == "sqlite:///" + os.path.abspath(first[10:])
    assert rest in ("", "the recorded studies that ship with autofit") and (not rest or
                                                                           storage_exists(bundled_storage_url()))


def _confirm_factor(words: str, monkeypatch) -> None:
    from autofit.search import SearchSettings

    monkeypatch.delenv("AUTOFIT_CONFIRM_FACTOR", raising=False)
    assert words == "AUTOFIT_CONFIRM_FACTOR, else 10"
    assert SearchSettings(script="train.py", device="cpu").confirm_factor == 10
    monkeypatch.setenv("AUTOFIT_CONFIRM_FACTOR", "3")
    assert SearchSettings(script="train.py", device="cpu").confirm_factor == 3


def _compile(words: str, monkeypatch) -> None:
    from autofit.options import SearchOptions

    assert words == "yes" and SearchOptions().compile is True


def _precision(words: str, monkeypatch) -> None:
    from autofit.devices import make_backend

    cpu = make_backend("cpu")
    assert words == "those the device runs natively, its fastest first"
    assert set(cpu.default_precisions()) <= set(cpu.supported_precisions()) and "fp16" not in cpu.default_precisions()


def _considered(flag: str):
    def check(words: str, monkeypatch) -> None:
        from autofit.config import CONSIDERED
        from autofit.options import SearchOptions

        knob = next(k for k in CONSIDERED if k.cli_flag == flag)
        values = SearchOptions().considered(knob.name, "cuda")
        assert words in (",".join(values), f"all {['one', 'two', 'three'][len(values) - 1]} when the function offers "
                                            f"its blocks to run.distribute")
    return check


def _study(words: str, monkeypatch) -> None:
    from autofit.study import default_study_name

    assert words == "SCRIPT.FUNCTION-DEVICE"
    assert default_study_name("train.py", "train", "cuda", 0) == "train.train-cuda0"


def _best_path(words: str, monkeypatch) -> None:
    from autofit.export import default_best_path, device_tag

    tag = device_tag("cuda", "NVIDIA H100 80GB HBM3")
    assert words.startswith("studies/SCRIPT.FUNCTION.DEVICE.best.json")
    assert default_best_path("train.py", "train", "studies", tag) == f"studies/train.train.{tag}.best.json"
    assert default_best_path("train.py", "train", "studies", device_tag("cpu")) == "studies/train.train.cpu.best.json"


def _report_path(words: str, monkeypatch) -> None:
    source = inspect.getsource(cli.commands["report"].callback)
    assert words == "studies/STUDY.report.html" and 'os.path.join("studies", f"{stored.name}.report.html")' in source


def _decorators(name: str):
    def check(words: str, monkeypatch) -> None:
        from autofit.options import SearchOptions
        from autofit.search import SearchSettings

        assert words.startswith(f"the decorator's {name}")
        assert getattr(SearchSettings(script="train.py", device="cpu"), name) is None and hasattr(SearchOptions(), name)
    return check


def _as_declared(words: str, monkeypatch) -> None:
    from autofit.config import KNOBS

    assert words == "as the script declares"
    assert all(k.default is None for k in KNOBS if k.name in ("loader_workers", "pin_memory", "prefetch_factor"))


def _device(words: str, monkeypatch) -> None:
    from autofit.devices import default_device

    assert words.startswith("$AUTOFIT_DEVICE where set, else the first visible GPU (cuda with --gpu), else cpu")
    monkeypatch.setenv("AUTOFIT_DEVICE", "cuda:1")
    assert default_device()[:2] == ("cuda", 1)  # the rest: tests/whitebox/test_device_default_help.py


def _estimate_memory(words: str, monkeypatch) -> None:
    from autofit.devices import DeviceInfo, default_memory_limit

    assert words == "this CPU's free memory"
    assert default_memory_limit(DeviceInfo("cpu", 0, "a CPU", 24 * GiB, 20 * GiB)) == 20 * GiB
    assert "default_memory_limit(info)" in inspect.getsource(cli.commands["estimate"].callback)


def _only_study(words: str, monkeypatch) -> None:
    import optuna

    from autofit.study import locate

    assert words == "the only study in the storage"
    url = "sqlite:///" + os.path.join(str(monkeypatch.tmp), "one.db")
    optuna.create_study(study_name="only", storage=url)
    assert locate(None, url).name == "only"


def _forecast_gpus(words: str, monkeypatch) -> None:
    from autofit.forecast import DEFAULT_TARGETS

    option = next(p for p in cli.commands["forecast"].params if "--gpu" in getattr(p, "opts", ()))
    assert words == "those five" and len(DEFAULT_TARGETS) == 5 and ",".join(DEFAULT_TARGETS) in option.help


#: Each option whose help states its default in words, by command (None: every command that has it).
WORDED = {
    ("search", "--memory-limit"): _search_limit, ("probe", "--memory-limit"): _probe_limit,
    ("search", "--probe-timeout"): _search_probe_timeout, ("probe", "--probe-timeout"): _probe_timeout,
    (None, "--storage"): _storage, (None, "--confirm-factor"): _confirm_factor, (None, "--compile"): _compile,
    (None, "--precision"): _precision, (None, "--checkpoint-policy"): _considered("--checkpoint-policy"),
    (None, "--sharding"): _considered("--sharding"), ("search", "--study"): _study, (None, "--study"): _only_study,
    ("search", "--out"): _best_path, ("export", "--out"): _best_path, ("report", "--out"): _report_path,
    (None, "--batch-range"): _decorators("batch_range"), (None, "--token-range"): _decorators("token_range"),
    (None, "--loader-workers"): _as_declared, (None, "--pin-memory"): _as_declared,
    (None, "--prefetch-factor"): _as_declared, (None, "--device"): _device, ("estimate", "--memory"): _estimate_memory,
    ("forecast", "--gpu"): _forecast_gpus,
}


def _worded_defaults() -> list[tuple[str, str, str]]:
    return [(name, next(o for o in param.opts if o.startswith("--")), _worded(param.help))
            for name, command in sorted(cli.commands.items()) for param in command.params
            if isinstance(param, click.Option) and not param.hidden and _worded(param.help)]


@pytest.mark.parametrize("name, flag, words", _worded_defaults(), ids=lambda v: str(v)[:40])
def test_each_default_stated_in_words_is_what_the_code_does(name, flag, words, monkeypatch, tmp_path):
    check = WORDED.get((name, flag)) or WORDED.get((None, flag))
    assert check is not None, (f"autofit {name} {flag} --help states its default in words ({words!r}): add to WORDED "
                               f"a check of those words against the code that makes the default")
    monkeypatch.tmp = tmp_path
    check(words, monkeypatch)


def test_the_worded_defaults_are_found():
    found = {(name, flag) for name, flag, _ in _worded_defaults()}
    assert ("search", "--memory-limit") in found and ("probe", "--memory-limit") in found and len(found) > 25
