"""A module-level training script not yet converted (no @autofit function, no autofit.start) is refused from its
source before the worker imports it: importing it once ran its whole training first, and the line that followed
did not mention autofit.start. A script that names the decorator at all is still imported (the import decides)."""

from __future__ import annotations

import pytest

from autofit.errors import UsageError
from autofit.probing._bootstrap import bootstrap
from autofit.probing._script import may_define_autofit
from autofit.probing._wire import LoadRequest
from tests.support import script


def test_the_worker_refuses_an_unconverted_script_before_any_of_it_runs(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("MODULE_LEVEL_RAN", str(marker))
    with pytest.raises(UsageError, match=r"or call autofit\.start\(\.\.\.\) at module level.*none of it ran"):
        bootstrap(LoadRequest(script("module_level.py")), cap_memory=False)
    assert not marker.exists()


@pytest.mark.parametrize("source, may", [
    ("from autofit import autofit\n@autofit\ndef train(run): pass\n", True),
    ("import autofit\n@autofit.autofit(global_batch=8)\ndef train(run): pass\n", True),
    ("from autofit.decorator import autofit as tune\ndef train(run): pass\ntrain = tune(train)\n", True),
    ("import autofit\nimport torch\nmodel = torch.nn.Linear(2, 2)\n", False),
    ("def train(run): pass\n", False),
    ("def broken(:\n", True),  # the import names a syntax error
])
def test_only_a_source_that_never_names_the_decorator_is_refused_unread(tmp_path, source, may):
    path = tmp_path / "train.py"
    path.write_text(source)
    assert may_define_autofit(str(path)) is may
