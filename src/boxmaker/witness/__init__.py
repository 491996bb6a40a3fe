"""``bxctl witness``: a small C2SP tlog-witness for one owner's ledgers
(docs/operations.md, "A witness for one owner")."""
