"""boxmaker: a local agent whose model only asks (see docs/architecture.md)."""

__version__ = "0.1.0"
