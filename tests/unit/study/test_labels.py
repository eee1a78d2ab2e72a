"""Probes that differ in one knob are told apart wherever a study is shown (issue 37, item 8): the frame had
no column for sharding, compile or the loader, and two rebuilders of a config's label dropped them and the
squares cap, so `autofit show` and the HTML report printed one label for different probes, missed a compiled
winner's star and starred every twin of a plain one. Now every label is `Config.label()` (the frame's
`label`), and the winner is starred once."""

from __future__ import annotations

import optuna

from autofit.config import Config
from autofit.findings import load_study
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.report import describe_study, write_report
from autofit.study import config_params, distributions, open_storage

GiB = 2**30
PLAIN = Config(batch_size=16, precision="fp32")
TWINS = [PLAIN, Config(batch_size=16, precision="fp32", compile=True), Config(batch_size=16, precision="fp32", loader_workers=2),
         Config(batch_size=16, precision="fp32", pin_memory=True), Config(batch_size=16, precision="fp32", prefetch_factor=4)]


def _stored(tmp_path, configs: list[tuple[Config, float]]):
    """A stored study of ok probes, as a search writes them, read back as `autofit show` reads it."""
    url = f"sqlite:///{tmp_path}/labels.db"
    study = optuna.create_study(study_name="labels", storage=open_storage(url), direction="maximize")
    space = SearchSpace.build(batch_range=(8, 64), precision=("fp32",), compile=(False, True))
    study.set_user_attr("autofit", {"script": "train.py", "function": "train", "device_info": {"type": "cpu",
                        "name": "cpu"}, "limit_bytes": 8 * GiB, "headroom": 0.1, "usable_bytes": 7 * GiB,
                        "space": space.to_dict()})
    dists = distributions((8, 64), 0, 1, offered=("compile", "loader"))
    for config, rate in configs:
        result = ProbeResult(status="ok", config=config, samples_per_s=rate, peak_bytes=GiB, step_time_median_s=1.0,
                             step_time_iqr_s=0.01, wall_s=2.0)
        params = {k: v for k, v in config_params(config).items() if k in dists}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=rate,
                                                  user_attrs={"probe": result.to_dict(), "phase": "explore",
                                                              "status": "ok"}))
    return load_study("labels", url)


def _shown(stored) -> list[str]:
    frame = stored.trials_frame()
    return describe_study(stored, frame, frame).splitlines()


def test_probes_that_differ_in_one_knob_have_different_labels_in_show(tmp_path):
    stored = _stored(tmp_path, [(c, 100.0 + i) for i, c in enumerate(TWINS)])
    frame = stored.trials_frame()
    assert list(frame["label"]) == [c.label() for c in TWINS] and frame["label"].nunique() == len(TWINS)
    lines = _shown(stored)
    for config in TWINS:
        assert any(f" {config.label()} " in line for line in lines), config.label()


def test_a_compiled_winner_is_starred_once_in_show_and_in_the_report(tmp_path):
    compiled = Config(batch_size=16, precision="fp32", compile=True)
    stored = _stored(tmp_path, [(PLAIN, 90.0), (compiled, 120.0), (compiled, 118.0)])
    stars = [line for line in _shown(stored) if line.startswith("*")]
    assert len(stars) == 1 and compiled.label() in stars[0]
    write_report(stored, str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    probes = page[page.rindex("<th>trial</th>"):]
    assert probes.count('class="best"') == 1 and "fp32 b=16 compiled" in probes.split('class="best"')[1][:200]
