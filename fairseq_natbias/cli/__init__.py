"""Command-line tools installed as console scripts (see setup.py)."""
