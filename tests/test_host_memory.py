"""Entry points restart with glibc keeping freed memory (marljax.host_memory)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from marljax.host_memory import ENV, SWITCH

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc malloc's; elsewhere the entry points do not restart",
)


def show(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (*ENV, SWITCH)}
    out = subprocess.run(
        [sys.executable, "-m", "marljax.host_memory"],
        env={**clean, **env},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return json.loads(out)


def test_restart_sets_the_settings_and_freed_memory_is_reused():
    kept = show()
    assert {k: kept[k] for k in ENV} == ENV and kept[SWITCH] == "1"
    # a second 256 MiB block written in a fresh thread reuses the first: no new pages
    assert kept["refault_pages_256mb"] <= 16


def test_opting_out_keeps_glibc_defaults_which_fault_every_block_in_again():
    default = show(**{SWITCH: "0"})
    assert all(default[k] is None for k in ENV)
    assert default["refault_pages_256mb"] >= 100  # 65,536 pages of 4 KiB (fewer with huge pages)


def test_a_setting_the_user_made_is_left_alone():
    assert show(MALLOC_ARENA_MAX="4")["MALLOC_ARENA_MAX"] == "4"


def test_marljax_demo_subcommand_reaches_the_demo():
    res = subprocess.run(
        [sys.executable, "-m", "marljax.cli", "demo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "python -m marljax.demo" in res.stdout and "--quick" in res.stdout
