"""Verifiers: sandboxed code execution, math answers, synthetic tasks (issue 5)."""
