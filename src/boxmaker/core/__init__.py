"""The pure core: no sockets, no files, no clock (spec §15). Time comes in as arguments."""
