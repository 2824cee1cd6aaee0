"""Generation on 8 simulated CPU devices (data x tensor mesh) equals single-device generation."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_sharded_generation_matches_single_device(run_on_fake_devices):
    proc = run_on_fake_devices(str(Path(__file__).with_name("_sharded_generate.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "sharded generate data=4 tensor=2: OK" in proc.stdout
