"""A study and its best-config file are named after the function searched, which the searching process
reads from the script's source (it never imports the user's module)."""

from __future__ import annotations

import textwrap

import pytest

from autofit.probing import decorated_name
from autofit.search import SearchSettings
from autofit.search._session import Session


def _script(tmp_path, body: str):
    path = tmp_path / "hf_user.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("decorator", ["@autofit", "@autofit(global_batch=16)", "@af.autofit", "@af.autofit()"])
def test_the_decorated_function_is_found_in_the_source(tmp_path, decorator):
    path = _script(tmp_path, f"""
        import autofit as af
        from autofit import autofit

        def helper(run):
            pass

        {decorator}
        def main(run):
            pass
    """)
    assert decorated_name(path) == "main"


def test_no_name_when_the_source_does_not_say(tmp_path):
    assert decorated_name(_script(tmp_path, "def main(run):\n    pass\n")) is None
    assert decorated_name(_script(tmp_path, "@autofit\ndef a(run): pass\n@autofit\ndef b(run): pass\n")) is None
    assert decorated_name(_script(tmp_path, "def broken(:\n")) is None
    assert decorated_name(str(tmp_path / "missing.py")) is None


def test_a_search_names_its_study_after_the_function(tmp_path):
    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    session = Session(SearchSettings(script=path, device="cpu", memory_limit=2**30, storage=storage))
    assert session.study_name == "hf_user.main-cpu0"
    named = Session(SearchSettings(script=path, function="other", device="cpu", memory_limit=2**30, storage=storage))
    assert named.study_name == "hf_user.other-cpu0"
