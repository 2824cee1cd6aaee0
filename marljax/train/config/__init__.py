"""Typed run configuration: the schema (`schema.py`) and loading it from YAML with overrides (`load.py`)."""

from marljax.train.config.load import ConfigError, apply_overrides, config_from_dict, dump_config, load_config
from marljax.train.config.schema import (
    AgentConfig,
    BufferConfig,
    DataConfig,
    FrozenModel,
    GridData,
    GrpoConfig,
    LossConfig,
    MeshConfig,
    ModelSpec,
    OptimizerConfig,
    PolicyConfig,
    RunConfig,
    SamplerConfig,
    SandboxSettings,
    SyntheticData,
    TrainSettings,
    WorkflowConfig,
)

__all__ = [
    "AgentConfig", "BufferConfig", "ConfigError", "DataConfig", "FrozenModel", "GridData", "GrpoConfig",
    "LossConfig", "MeshConfig", "ModelSpec", "OptimizerConfig", "PolicyConfig", "RunConfig", "SamplerConfig",
    "SandboxSettings", "SyntheticData", "TrainSettings", "WorkflowConfig", "apply_overrides", "config_from_dict",
    "dump_config", "load_config",
]
