"""The pure core: no sockets, no files, no clock. Time comes in as arguments."""
