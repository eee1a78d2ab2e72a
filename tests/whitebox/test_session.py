"""A search session (autofit.search._session) names its study after the function searched."""

from __future__ import annotations

import textwrap

from autofit.search import SearchSettings
from autofit.search._session import Session


def _script(tmp_path, body: str):
    path = tmp_path / "hf_user.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_search_names_its_study_after_the_function(tmp_path):
    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    session = Session(SearchSettings(script=path, device="cpu", memory_limit=2**30, storage=storage))
    assert session.study_name == "hf_user.main-cpu0"
    named = Session(SearchSettings(script=path, function="other", device="cpu", memory_limit=2**30, storage=storage))
    assert named.study_name == "hf_user.other-cpu0"
