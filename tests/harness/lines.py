"""Reading a file another process is still appending lines to."""

from __future__ import annotations

from pathlib import Path


def whole_lines(path: Path) -> list[bytes]:
    """The lines of ``path`` that are whole so far. A reader is not kept out of a write
    in progress, so a look while another process appends may end inside a line: the
    part after the last newline is left for the next look.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "log"
    ...     _ = path.write_bytes(b'{"a":1}\\n{"b"')
    ...     whole_lines(path)
    [b'{"a":1}']
    """
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].splitlines()
