"""The research scripts' tests share the package tests' fixtures
(tests/natbias_fixtures.py; pytest.ini puts tests/ on the path)."""

from natbias_fixtures import *  # noqa: F403  (the fixtures, registered here)
