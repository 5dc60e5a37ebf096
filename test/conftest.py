"""Shared fixtures: an isolated NEMORUN_HOME for every test."""

import os

import pytest
from nemo_run.config import get_nemorun_home, set_nemorun_home


@pytest.fixture(autouse=True)
def nemorun_home(tmp_path, monkeypatch):
    """Experiments, app records and job dirs go to a per-test directory, also for subprocesses."""
    home = tmp_path / "nemorun_home"
    home.mkdir()
    previous = get_nemorun_home()
    set_nemorun_home(str(home))
    monkeypatch.setenv("NEMORUN_HOME", str(home))
    yield home
    set_nemorun_home(previous)
