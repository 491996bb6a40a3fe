"""brokerd: the thin trio shell around core/ and ledger/ (spec §2, §3, §5.3, §6-§8)."""
