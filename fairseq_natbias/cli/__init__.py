"""The console scripts that need fairseq (see pyproject.toml)."""
