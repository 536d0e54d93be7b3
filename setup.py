"""A shim for tools that still call setup.py; everything is in pyproject.toml."""

from setuptools import setup

setup()
