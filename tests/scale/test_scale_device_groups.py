"""Two policies on disjoint 4-device groups train and sample on their own devices (subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow(seconds=50)
def test_policies_on_disjoint_device_groups(run_on_fake_devices):
    proc = run_on_fake_devices(str(Path(__file__).with_name("_scale_device_groups.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "two policies on disjoint device groups: OK" in proc.stdout, proc.stdout
