"""Adapter policies sample on a mesh of their own (`sampler_mesh`), the base copied there once
(subprocess on 8 simulated devices)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_adapter_policies_sample_on_their_own_mesh(run_on_fake_devices):
    proc = run_on_fake_devices(str(Path(__file__).with_name("_scale_lora_sampler_mesh.py")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "adapter policies sampling on their own mesh: OK" in proc.stdout, proc.stdout
