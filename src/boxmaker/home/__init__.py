"""The home directory, its config.toml and its files (docs/runbook.md#config).

paths.py: :class:`~boxmaker.home.paths.Home`, every path of the system and its private
directories; config.py: config.toml read into :class:`~boxmaker.home.config.Config`;
defaults.py: the files ``bxctl init`` writes; reload.py: what of a re-read config.toml a
running daemon takes (docs/runbook.md#reload). The home's files, read and written the
careful way: regular_file.py (never through a link, never a FIFO), file_ops.py (one
durable replace), state_files.py (session states), grants_file.py and grants_edit.py
(grants.toml read, and changed).
"""
