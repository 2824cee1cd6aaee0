"""Where `jax.distributed.initialize` gets its settings: config, MARLJAX_* variables, SLURM, TPU."""

from __future__ import annotations

import pytest

from marljax.train import distributed
from marljax.train.config import config_from_dict
from marljax.train.distributed import DistributedConfig, first_host, initialize, resolve

SLURM = {
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_NODELIST": "gpu[003-005,9],cpu1",
}


@pytest.mark.parametrize(
    "nodes, host",
    [
        ("node7", "node7"),
        ("node001,host2", "node001"),
        ("gpu[003-005,9],cpu1", "gpu003"),
        ("a-b[12,14]", "a-b12"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodes, host):
    assert first_host(nodes) == host


def test_single_process_by_default(monkeypatch):
    monkeypatch.setattr(distributed, "_on_tpu_vm", lambda: False)
    assert resolve(env={}, on_tpu_vm=False) is None
    assert (
        resolve(env={"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n1"}, on_tpu_vm=False)
        is None
    )  # a one-task srun is a single process
    assert initialize(env={}) is False  # nothing to join: jax.distributed is left alone


def test_marljax_variables():
    got = resolve(
        env={
            "MARLJAX_COORDINATOR": "10.0.0.2:7777",
            "MARLJAX_NUM_PROCESSES": "2",
            "MARLJAX_PROCESS_ID": "1",
            "MARLJAX_LOCAL_DEVICE_IDS": "0,1",
        },
        on_tpu_vm=False,
    )
    assert got == {
        "coordinator_address": "10.0.0.2:7777",
        "num_processes": 2,
        "process_id": 1,
        "local_device_ids": [0, 1],
        "initialization_timeout": 300,
    }


def test_slurm_variables_and_derived_coordinator():
    got = resolve(env=SLURM, on_tpu_vm=False)
    # JAX's own convention for the port: job id mod 4096 in the top of the ephemeral range
    assert got["coordinator_address"] == f"gpu003:{1234 % 4096 + 61440}"
    assert (got["num_processes"], got["process_id"]) == (4, 2)
    got = resolve(env={**SLURM, "MARLJAX_COORDINATOR_PORT": "5000"}, on_tpu_vm=False)
    assert got["coordinator_address"] == "gpu003:5000"
    got = resolve(env={**SLURM, "MARLJAX_COORDINATOR": "login1:6000"}, on_tpu_vm=False)
    assert got["coordinator_address"] == "login1:6000"
    del_nodes = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    got = resolve(env={**del_nodes, "SLURM_JOB_NODELIST": "c[10-11]"}, on_tpu_vm=False)
    assert got["coordinator_address"].startswith("c10:")


def test_config_wins_over_environment():
    cfg = DistributedConfig(
        coordinator_address="head:1", num_processes=4, process_id=3, initialization_timeout=9
    )
    got = resolve(cfg, env=SLURM, on_tpu_vm=False)
    assert (
        got["coordinator_address"],
        got["num_processes"],
        got["process_id"],
        got["initialization_timeout"],
    ) == ("head:1", 4, 3, 9)


def test_tpu_and_modes():
    assert resolve(env={}, on_tpu_vm=True) == {}  # Cloud TPU VM: JAX detects the slice itself
    assert resolve(DistributedConfig(mode="tpu"), env={}) == {}
    assert resolve(env={"MARLJAX_DISTRIBUTED": "tpu"}, on_tpu_vm=False) == {}
    assert resolve(DistributedConfig(mode="off"), env=SLURM) is None
    assert resolve(env={**SLURM, "MARLJAX_DISTRIBUTED": "off"}) is None


def test_incomplete_or_inconsistent_settings_are_errors():
    with pytest.raises(ValueError, match="num_processes, process_id"):
        resolve(env={"MARLJAX_COORDINATOR": "h:1"}, on_tpu_vm=False)
    with pytest.raises(ValueError, match="coordinator_address"):
        resolve(DistributedConfig(mode="on"), env={}, on_tpu_vm=False)
    with pytest.raises(ValueError, match=r"process_id 2 not in \[0, num_processes=2\)"):
        resolve(DistributedConfig(coordinator_address="h:1", num_processes=2, process_id=2), env={})
    with pytest.raises(ValueError, match="MARLJAX_NUM_PROCESSES='two'"):
        resolve(env={"MARLJAX_COORDINATOR": "h:1", "MARLJAX_NUM_PROCESSES": "two"})
    with pytest.raises(ValueError, match="MARLJAX_DISTRIBUTED='maybe'"):
        resolve(env={"MARLJAX_DISTRIBUTED": "maybe"})


def test_run_config_sections():
    base = {
        "policies": {"main": {"model": {"preset": "tiny-qwen3"}}},
        "agents": {"a": {"policy": "main"}},
        "data": {"source": {"kind": "synthetic", "n_train": 4}},
    }
    cfg = config_from_dict(
        {
            **base,
            "distributed": {"coordinator_address": "h:1", "num_processes": 2},
            "policies": {
                "main": {"model": {"preset": "tiny-qwen3"}, "sampler_mesh": {"data": 2, "tensor": 2}}
            },
        }
    )
    assert cfg.distributed.num_processes == 2 and cfg.policies["main"].sampler_mesh.tensor == 2
    assert config_from_dict(base).policies["main"].sampler_mesh is None
    with pytest.raises(ValueError, match="distributed.coordinator: unknown key"):
        config_from_dict({**base, "distributed": {"coordinator": "h:1"}})
