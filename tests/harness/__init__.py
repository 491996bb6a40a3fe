"""What tests share: homes, brokerd in process and as a process, sandbox workspaces,
the whole stack, and the fixtures (fixtures.py, a plugin tests/conftest.py loads)."""
