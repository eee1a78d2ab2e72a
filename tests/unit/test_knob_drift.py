"""One declaration per knob (issue 38): every knob of `Config` (autofit.knobs) reaches every place that shows,
stores or takes a config, because those places are derived from the declaration. Each test runs over the
knobs as declared, so a knob added tomorrow is held to them too; one adds a knob to a copy of the package's
declaration alone and finds it everywhere, the search space included (issue 47). A declaration a search could
not take (no offer, or an offer the runtime never notes) is refused where it is made."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import optuna
import pytest
from click.testing import CliRunner

import autofit.knobs as knobs_module
from autofit.cli import cli
from autofit.config import KNOB, KNOBS, Config
from autofit.errors import UsageError
from autofit.findings import load_study
from autofit.planner import STRATEGY_KNOBS, SearchSpace
from autofit.probing import ProbeResult
from autofit.report import describe_study, write_report
from autofit.study import config_params, distributions, open_storage, trial_config

GiB = 2**30
PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "autofit")
#: Two plain configs, by samples and by tokens; each knob is varied on the first that takes another value.
BASES = (Config(batch_size=8, checkpoint_segments=2), Config(batch_size=8, max_tokens=64, checkpoint_segments=2))
EVERY_OFFER = tuple(sorted({k.offer for k in KNOBS if k.offer and k.offer != KNOB["max_tokens"].offer}))  # "tokens": a token_range


def _varied(knob) -> tuple[Config, Config]:
    """A base config and one that differs from it in `knob` alone (the first value it takes there)."""
    candidates = (*knob.trial_values(), *(knob.choices or ()), 1, 2, 16, 4096)
    for base in BASES:
        for value in candidates:
            if value == getattr(base, knob.name):
                continue
            try:
                varied = dataclasses.replace(base, **{knob.name: value})
            except UsageError:
                continue
            if varied.ranked_by == base.ranked_by:  # both by samples, or both by tokens: one space holds them
                return base, varied
    raise AssertionError(f"no value of {knob.name} differs from the bases")


@pytest.fixture(params=KNOBS, ids=lambda knob: knob.name)
def knob(request):
    return request.param


def test_every_knob_changes_the_label(knob):
    base, varied = _varied(knob)
    assert base.label() != varied.label()


def test_every_knob_is_a_probe_flag():
    shown = CliRunner().invoke(cli, ["probe", "--help"], terminal_width=200).output
    for knob in KNOBS:
        assert knob.cli_flag in shown and knob.help.split()[0] in shown, knob.name


def test_every_knob_round_trips_its_json_and_its_trial(knob):
    base, varied = _varied(knob)
    assert Config.from_dict(json.loads(json.dumps(varied.to_dict()))) == varied
    held = getattr(base, knob.name) != knob.default or knob.stored  # a default is left out: old files keep their form
    assert (knob.name in base.to_dict()) == held
    token_range = (1, 4096) if varied.max_tokens else None
    dists = distributions((1, 64), 4, 8, offered=EVERY_OFFER, token_range=token_range)
    assert knob.name in dists or (knob.offer == TOKEN_OFFER and token_range is None)
    trial = optuna.trial.create_trial(params=config_params(varied), distributions=dists, value=1.0)
    assert trial_config(trial) == varied


def _stored(tmp_path, probes: list[tuple[Config, float]]):
    """A stored study of ok probes, as a search writes them, read back as `autofit show` reads it."""
    url = f"sqlite:///{tmp_path}/drift.db"
    study = optuna.create_study(study_name="drift", storage=open_storage(url), direction="maximize")
    tokens = any(c.max_tokens for c, _ in probes)
    # Every strategy knob at every value it declares (the ints without a list at a few), so the probes' configs are the space's.
    every = {k.name: tuple(v for v in k.trial_values() if v is not None) for k in STRATEGY_KNOBS if k.trial_values()}
    space = SearchSpace.build(batch_range=(1, 64), token_range=(1, 4096) if tokens else None,
                              **{**every, "checkpoint_segments": (0, 1, 2, 4), "accumulation_steps": (1, 2)})
    study.set_user_attr("autofit", {"script": "train.py", "function": "train", "device_info": {"type": "cpu",
                        "name": "cpu"}, "limit_bytes": 8 * GiB, "headroom": 0.1, "usable_bytes": 7 * GiB,
                        "space": space.to_dict()})
    dists = distributions((1, 64), 4, 8, offered=EVERY_OFFER, token_range=(1, 4096) if tokens else None)
    for config, rate in probes:
        result = ProbeResult(status="ok", config=config, samples_per_s=rate, peak_bytes=GiB, step_time_median_s=1.0,
                             step_time_iqr_s=0.01, wall_s=2.0, **({"tokens_per_s": rate} if tokens else {}))
        study.add_trial(optuna.trial.create_trial(params=config_params(config), distributions=dists, value=rate,
                                                  user_attrs={"probe": result.to_dict(), "phase": "explore",
                                                              "status": "ok"}))
    return load_study("drift", url)


def test_every_knob_has_a_column_and_its_own_label_in_show_and_why_with_the_winner_starred_once(knob, tmp_path):
    base, varied = _varied(knob)
    stored = _stored(tmp_path, [(base, 90.0), (varied, 120.0), (varied, 118.0)])
    frame = stored.trials_frame()
    assert list(frame[knob.name].astype(object).where(frame[knob.name].notna(), None)) == [
        getattr(base, knob.name), getattr(varied, knob.name), getattr(varied, knob.name)]
    assert list(frame["label"]) == [base.label(), varied.label(), varied.label()]
    shown = describe_study(stored, frame, frame).splitlines()
    assert any(f" {base.label()} " in line for line in shown)
    stars = [line for line in shown if line.startswith("*")]
    assert len(stars) == 1 and f" {varied.label()} " in stars[0]
    assert stored.document().why.startswith(f"{varied.label()}: ")  # the why-line names the winner so too


@pytest.mark.parametrize("tokens", [False, True], ids=["by samples", "by tokens"])
def test_the_report_labels_each_knobs_variant_apart_and_stars_the_winner_once(tokens, tmp_path):
    """Every knob's variant of one kind in one study (a report is the costly part): each its own label in the
    report's probes, the fastest starred once."""
    pairs = [_varied(k) for k in KNOBS]
    variants = [v for b, v in pairs if (b.max_tokens is not None) == tokens]
    base = next(b for b, _ in pairs if (b.max_tokens is not None) == tokens)
    stored = _stored(tmp_path, [(base, 50.0), *((v, 60.0 + i) for i, v in enumerate(variants))])
    write_report(stored, str(tmp_path / "report.html"))
    probes = (tmp_path / "report.html").read_text()
    probes = probes[probes.rindex("<th>trial</th>"):]
    labels = [c.label() for c in (base, *variants)]
    assert len(set(labels)) == len(labels) and all(f">{label}<" in probes for label in labels)
    assert probes.count('class="best"') == 1 and variants[-1].label() in probes.split('class="best"')[1][:300]


#: A knob added to the declaration (autofit/config.py) and nowhere else.
_ADDED = '''
    channels_last_test: bool = knob(
        default=False, kind=bool, offer="channels_last", order="compute",
        label=lambda value, item: "channels-last-test" if value else None,
        help="Zzchannels: the model and its batches in channels-last memory format.")
    offload_test: str = knob(
        default="none", kind=str, choices=("none", "cpu"), offer="checkpoint_blocks", order="memory",
        label=lambda value, item: None if value == "none" else f"offload-{value}",
        help="Zzoffload: where the optimizer state is kept.",
        consider="Zzconsider: the offloads a search considers.")
'''

_CHECK = textwrap.dedent('''
    import inspect, json, optuna
    from click.testing import CliRunner
    from autofit import autofit
    from autofit.options import search_options
    from autofit.cli import cli
    from autofit.search import SearchSettings
    from autofit.config import Config
    from autofit.study import COLUMNS, config_params, distributions, trial_config, trials_frame
    from autofit.probing import ProbeResult
    from autofit.knobs import Offers
    from autofit.options import SearchOptions
    from autofit.planner import Asked, SearchSpace, compute_variants, knob_values

    config = Config(batch_size=8, channels_last_test=True)
    shown = CliRunner().invoke(cli, ["probe", "--help"], terminal_width=200).output
    dists = distributions((1, 64), 0, 1, offered=("channels_last",))
    params = {k: v for k, v in config_params(config).items() if k in dists}
    trial = optuna.trial.create_trial(params=params, distributions=dists, value=1.0,
                                      user_attrs={"probe": ProbeResult(status="ok", config=config).to_dict()})
    searched = {c: CliRunner().invoke(cli, [c, "--help"], terminal_width=200).output for c in ("search", "estimate")}
    declared = search_options(offload_test="cpu")
    offers = Offers(checkpoint_blocks=4, channels_last=True)
    space = SearchSpace.build(batch_range=(1, 64), variants=compute_variants(Asked(offers, SearchOptions(), "cpu")),
                              **knob_values(Asked(offers, SearchOptions(), "cpu")))
    unoffered = SearchSpace.build(batch_range=(1, 64), **knob_values(Asked(Offers(), SearchOptions(), "cpu")))
    print(json.dumps({
        "help": "--channels-last-test" in shown and "Zzchannels" in shown,
        "consider_flags": all("--offload-test" in h and "Zzconsider" in h for h in searched.values()),
        "consider_argument": "offload_test" in inspect.signature(autofit).parameters,
        "consider_options": [declared.consider, list(declared.considered("offload_test", "cpu"))],
        "consider_settings": SearchSettings(script="t.py", consider={"offload_test": "none"}).consider,
        "param": trial.params.get("channels_last_test"),
        "trial": trial_config(trial) == config,
        "column": COLUMNS.get("channels_last_test"),
        "frame": bool(trials_frame([trial], None)["channels_last_test"][0]),
        "label": config.label(),
        "json": config.to_dict().get("channels_last_test"),
        "round_trip": Config.from_dict(config.to_dict()) == config,
        "old_form": "channels_last_test" not in Config(batch_size=8).to_dict(),
        "space": [sorted({s.offload_test for s in space.strategies()}), [name for name, _ in space.variants],
                  sorted({c.offload_test for c in space.configs()}), SearchSpace.from_dict(space.to_dict()) == space,
                  "offload_test" in distributions(**space.distribution_args()),
                  sorted({s.offload_test for s in unoffered.strategies()})],
    }))
''')


def test_a_knob_added_to_the_declaration_alone_is_in_help_the_trial_the_frame_the_label_the_json_and_the_space(
        tmp_path):
    """And one whose values a search takes a list of (`consider`): a flag of `search` and `estimate`, an argument of
    @autofit, a list in SearchOptions and SearchSettings. A memory knob is a strategy's, tried where the function
    offers it and at its default alone elsewhere; a compute knob a variant of the leader: no table names them."""
    copy = tmp_path / "autofit"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "recorded"))
    source = (copy / "config.py").read_text()
    anchor = '    def __post_init__(self) -> None:\n        for declared in KNOBS:'
    assert anchor in source
    (copy / "config.py").write_text(source.replace(anchor, _ADDED.lstrip("\n") + "\n" + anchor, 1))
    ran = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.splitlines()[-1])
    assert found == {"help": True, "consider_flags": True, "consider_argument": True,
                     "consider_options": [{"offload_test": ["cpu"]}, ["cpu"]],
                     "consider_settings": {"offload_test": ["none"]}, "param": True, "trial": True, "column": "boolean", "frame": True,
                     "label": "fp32 b=8 channels-last-test", "json": True, "round_trip": True, "old_form": True,
                     "space": [["cpu", "none"], ["channels_last", "channels_last_test"], ["cpu", "none"], True, True, ["none"]]}


def _declared(**declaration) -> tuple:
    """The knobs of a record that declares one knob beside a size, as `autofit.knobs.knobs` takes them."""
    @dataclasses.dataclass
    class Record:
        batch_size: int = knobs_module.knob(default=1, kind=int, order="size", help="the size")
        added: bool = knobs_module.knob(default=False, kind=bool, help="the knob", **declaration)

    return knobs_module.knobs(Record)


def test_a_knob_that_could_never_be_searched_is_refused_where_it_is_declared():
    """Trap 1: a knob with no offer (not the size) was a trial param of every study and never searched."""
    with pytest.raises(UsageError, match="must name what the function offers.*but added has none"):
        _declared(order="memory")
    with pytest.raises(UsageError, match="but added has none"):
        _declared(order="compute")
    assert [k.name for k in _declared(order="memory", offer="checkpoint_blocks")] == ["batch_size", "added"]


def test_an_offer_the_runtime_never_notes_is_refused_where_it_is_declared():
    """Trap 2: a misspelt offer (or one of a name the runtime has no field for) was silently never searched."""
    with pytest.raises(UsageError, match="offer must be one the runtime notes.*but added has 'compiled'"):
        _declared(order="memory", offer="compiled")
    with pytest.raises(UsageError, match="but added has 'own_batch'"):  # the search sets it, the runtime never does
        _declared(order="memory", offer="own_batch")


def _noted_in_runtime() -> set[str]:
    """The attributes the runtime's modules assign (`self.used.compile = True`, `knobs.backward = ...`)."""
    runtime = os.path.join(PACKAGE, "runtime")
    noted = set()
    for name in os.listdir(runtime):
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(open(os.path.join(runtime, name), encoding="utf-8").read())):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, (ast.AugAssign, ast.AnnAssign)) else []
                noted |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
    return noted


def test_every_offer_a_knob_may_name_is_noted_by_the_runtime():
    """The offers (autofit.knobs' Offers fields) are what the runtime's record holds, and each is noted somewhere
    in autofit/runtime: an offer it never notes would leave its knobs unsearched."""
    from autofit.runtime import Knobs

    assert set(knobs_module.OFFERS) <= {f.name for f in dataclasses.fields(Knobs)}
    assert set(knobs_module.OFFERS) - _noted_in_runtime() == set()
    assert {k.offer for k in KNOBS if k.offer} <= set(knobs_module.OFFERS)
    assert "no_such_offer" not in _noted_in_runtime()  # the check can fail: a field never assigned is found


def _every_field_set(record_type) -> dict:
    """A value for each field of an `Offers` (or a subclass) other than its default, whatever the field."""
    return {f.name: True if f.default is False else 3 for f in dataclasses.fields(record_type)}


def test_the_offers_record_round_trips_every_field_it_has():
    """`Offers.to_dict` is derived from the fields: every field, set to something else than its default, comes
    back through the record's JSON (the hand-written dict dropped the loader's workers without `loader`), and so
    does a field a later version adds (a subclass here: what a field added to `Offers` would be)."""
    offers = knobs_module.Offers(**_every_field_set(knobs_module.Offers))
    assert knobs_module.Offers.from_dict(json.loads(json.dumps(offers.to_dict()))) == offers

    @dataclasses.dataclass
    class Later(knobs_module.Offers):
        a_later_offer: bool = False

    later = Later(**_every_field_set(Later))
    assert later.a_later_offer and Later.from_dict(json.loads(json.dumps(later.to_dict()))) == later
    assert Later.from_dict(knobs_module.Offers().to_dict()) == Later()  # an older record: the new field at its default


def test_an_old_studys_knob_usage_dict_reads_as_the_record(tmp_path):
    """The child sends autofit.knobs' Offers; a probe (and a study) recorded before it kept the same dict, read
    back as the record: from the bundled recorded study, and from a dict of the old form."""
    old = {"compile": False, "autocast": True, "backward": True, "checkpoint_blocks": 4, "batches": True,
           "shard_blocks": None, "loader": True, "declared_workers": 2, "longest_sample": 300, "own_batch": 16,
           "token_envelope": {"longest_sample": 300, "padded_tokens": 600, "padded_squares": 180000}}
    offers = knobs_module.Offers.from_dict(old)
    assert (offers.autocast, offers.checkpoint_blocks, offers.declared_workers, offers.own_batch) == (True, 4, 2, 16)
    assert offers.noted("checkpoint_blocks") and not offers.noted("compile") and not offers.noted("shard_blocks")
    assert knobs_module.Offers.from_dict(json.loads(json.dumps(offers.to_dict()))) == offers
    assert knobs_module.Offers.from_dict({**old, "a_key_of_a_later_version": 1}) == offers
    db = os.path.join(PACKAGE, "recorded", "autofit.db")
    shutil.copy(db, tmp_path / "old.db")
    storage = open_storage(f"sqlite:///{tmp_path}/old.db")
    studies = optuna.get_all_study_summaries(storage)
    probes = [ProbeResult.from_dict(t.user_attrs["probe"]) for summary in studies
              for t in optuna.load_study(study_name=summary.study_name, storage=storage).trials if "probe" in t.user_attrs]
    kept = [p for p in probes if p.knobs]
    assert kept and all(p.offers == knobs_module.Offers.from_dict(p.knobs) for p in kept)
    assert all(p.offers.to_dict().items() >= {k: v for k, v in p.knobs.items() if v}.items() for p in kept)
