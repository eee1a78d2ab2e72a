"""A study and its best-config file are named after the function searched, which the searching process
reads from the script's source (it never imports the user's module)."""

from __future__ import annotations

import textwrap

import pytest

from autofit.probing import decorated_name


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


