from __future__ import annotations

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
REPO = os.path.dirname(HERE)
STUDIES = os.path.join(REPO, "studies")


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


@pytest.fixture(scope="session")
def scripts_dir() -> str:
    return SCRIPTS
