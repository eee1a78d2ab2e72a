"""Studies and best-config files built by hand for tests that check what is read from them: a study of
given probe records (as they cross from a probe to the stored study), and records_config.py beside a file."""

from __future__ import annotations

import json
import shutil

import optuna

from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.study import SCRIPT_ATTR, config_params, distributions
from tests.support import script

GiB = 2**30


def study_of(results: list[ProbeResult], space: SearchSpace, batch_range: tuple[int, int],
             token_range: tuple[int, int] | None = None, stamps: list[str | None] | None = None,
             phases: list[str] | None = None, attrs: list[dict] | None = None) -> optuna.Study:
    """An in-memory CPU study (8 GiB limit) of `space` (built with these ranges) holding each result as a
    complete trial of its phase in `phases` (default: explored); `stamps`, the script sha256 each trial ran
    under (None: none, as recorded before trials carried it); `attrs`, more user attributes of each."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("autofit", {
        "script": "train.py", "function": "train", "device_info": {"type": "cpu", "name": "cpu"},
        "limit_bytes": 8 * GiB, "headroom": 0.1, "usable_bytes": 7 * GiB, "space": space.to_dict()})
    dists = distributions(batch_range, 0, 1, token_range=token_range)
    for result, stamp, phase, more in zip(results, stamps or [None] * len(results),
                                          phases or ["explore"] * len(results), attrs or [{}] * len(results), strict=True):
        stored = ProbeResult.from_dict(result.to_dict())  # as the probe's record crosses to the study
        study.add_trial(optuna.trial.create_trial(
            params={k: v for k, v in config_params(stored.config).items() if k in dists}, distributions=dists,
            value=stored.samples_per_s,
            state=optuna.trial.TrialState.COMPLETE,
            user_attrs={"probe": stored.to_dict(), "phase": phase, "status": stored.status,
                        **({SCRIPT_ATTR: stamp} if stamp else {}), **more}))
    return study


def records_config_with_best(tmp_path, **fields) -> None:
    """records_config.py as train.py, beside a best-config file of batch 5 with `fields` added."""
    shutil.copy(script("records_config.py"), tmp_path / "train.py")
    document = {
        "schema": "autofit.best-config", "schema_version": 1,
        "config": {"batch_size": 5, "accumulation_steps": 1, "precision": "fp32", "checkpoint_segments": 0},
        "measured": {}, "memory": {}, "device": {"type": "cpu", "name": "x"}, "versions": {}, **fields,
    }
    (tmp_path / "best.json").write_text(json.dumps(document))
