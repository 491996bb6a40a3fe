"""brokerd: the thin trio shell around core/ and ledger/ (docs/architecture.md,
docs/protocol.md)."""
