"""Multi-agent interaction patterns (issue 7)."""
