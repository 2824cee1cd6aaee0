"""Sharded Policy updates on 8 simulated CPU devices equal the single-device update (subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_sharded_update_matches_single_device(run_on_fake_devices):
    proc = run_on_fake_devices(str(Path(__file__).with_name("_scale_sharded_update.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for mesh in ("fsdp=8", "data=8", "fsdp=4 tensor=2", "data=2 fsdp=2 tensor=2"):
        assert f"sharded update {mesh}: OK" in proc.stdout, proc.stdout
