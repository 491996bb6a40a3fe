"""How boxmaker's values are written as text: the one cattrs converter (frames and
files) with the id formats, the records' wall time, and outside text made safe for a
terminal or a log."""
