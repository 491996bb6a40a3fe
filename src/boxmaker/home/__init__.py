"""The home directory and its config.toml (docs/runbook.md#config).

paths.py: :class:`~boxmaker.home.paths.Home`, every path of the system and its private
directories; config.py: config.toml read into :class:`~boxmaker.home.config.Config`;
defaults.py: the files ``bxctl init`` writes; reload.py: what of a re-read config.toml a
running daemon takes (docs/runbook.md#reload).
"""
