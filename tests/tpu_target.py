"""Tests that compile for a TPU target ahead of time on this CPU need libtpu: a test dependency on
Linux x86_64, where those tests must run; elsewhere (no wheel) they are skipped, saying why.
Imported by name from test files (`tests/` is on the path through its conftest)."""

from __future__ import annotations

import platform
import sys

import pytest


def has_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


def libtpu_required() -> bool:
    return sys.platform == "linux" and platform.machine() == "x86_64"


needs_libtpu = pytest.mark.skipif(
    not has_libtpu() and not libtpu_required(),
    reason="libtpu (TPU ahead-of-time compilation) is a test dependency on Linux x86_64 only",
)
