"""Tools of declarative crews (MCP servers, Python tools) and the effect ledger that journals
every tool call write-ahead (see ``ledger``)."""
