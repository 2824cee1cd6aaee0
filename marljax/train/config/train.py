"""How a run trains (`TrainConfig`): steps, checkpoints, evaluation, logging, the SFT warm start and
its teacher, dynamic sampling and the sandbox pool."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from marljax.train.config.fields import FrozenModel, raise_problems
from marljax.train.dynamic_sampling import KEEP_RULES, WHEN_NONE
from marljax.train.metrics import SINKS


class SandboxPoolConfig(FrozenModel):
    workers: int | None = Field(None, ge=1, description="parallel test processes; None = CPU count + 1")
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: int = Field(512, ge=1)


class DynamicSamplingConfig(FrozenModel):
    keep: Literal[KEEP_RULES] = Field(
        "accuracy",
        description="which problems teach: accuracy, those whose completions' pass flags vary (DAPO: "
        "std of passed > 0); advantage, those with a completion of non-zero advantage",
    )
    max_rounds: int = Field(3, ge=1, description="rollouts per step at most")
    when_none: Literal[WHEN_NONE] = Field(
        "skip",
        description="when no round has a problem that teaches: skip (train nothing this step) or "
        "train (the first round whole)",
    )


class SftTeacherConfig(FrozenModel):
    """A scripted teacher whose turns SFT imitates: it plays every agent of the run's workflow on the
    train problems, and each agent's (prompt, reply) pairs become its policy's SFT examples, the
    prompts encoded as the policy will see them when it samples the same turns (multi-turn and tool
    workflows, whose later prompts hold earlier turns, included)."""

    script: str = Field(
        description="`module:function` (a module in the current directory, on PYTHONPATH or installed), called with "
        "`options` and `seed` (the run's); it returns a `ScriptedGenerator` script "
        "`(agent, prompt, k, seed) -> reply` (e.g. `marljax.demo.tools:teacher`)"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of `script`")
    rounds: int = Field(
        16, ge=1, description="rollouts of the workflow recorded, each over data.batch_size problems"
    )

    @field_validator("script")
    @classmethod
    def _importable(cls, v):
        _function(v)
        return v

    @model_validator(mode="after")
    def _takes_its_options(self):
        try:
            inspect.signature(_function(self.script)).bind(**self.options, seed=0)
        except TypeError as e:
            raise_problems(
                [(("options",), f"{self.script} does not take these (and seed): {e}", self.options)]
            )
        return self

    def make_script(self, seed: int):
        return _function(self.script)(**self.options, seed=seed)


def _function(script: str):
    """The function `module:function` names; ValueError saying what is wrong otherwise."""
    module, _, name = script.partition(":")
    if not (module and name):
        raise ValueError(f"expected `module:function`, got {script!r}")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError as e:
        raise ValueError(f"module {module!r} cannot be imported: {e}") from e
    if not callable(found):
        raise ValueError(f"{module} has no function {name!r}")
    return found


# keys of `train` that were renamed, and what to write instead (a run record of an older version
# holding them is read through `load.upgrade_record`)
RENAMED_TRAIN_KEYS = {
    "tensorboard": "renamed to train.log_to, a list: `log_to: [tensorboard]` for true, `log_to: []` for false",
    "max_sampling_rounds": "renamed to train.dynamic_sampling.max_rounds: `dynamic_sampling: {max_rounds: N}`",
}


class WandbConfig(FrozenModel):
    """Weights & Biases settings, used when `train.log_to` holds wandb."""

    project: str | None = Field(None, description="None: $WANDB_PROJECT, else marljax")
    entity: str | None = Field(None, description="team or user; None: wandb's default ($WANDB_ENTITY)")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="offline writes the run under RUN_DIR/wandb/ for a later `wandb sync`; None: "
        "$WANDB_MODE, else online",
    )


class TrainConfig(FrozenModel):
    steps: int = Field(100, ge=1)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(
        3,
        ge=1,
        description="the newest N checkpoints are kept, and step 0 (the policy after SFT) when SFT ran",
    )
    async_checkpoint: bool = True
    log_every: int = Field(1, ge=1)
    eval_every: int | None = Field(
        None, ge=1, description="evaluate every N steps and once before RL (step 0); None disables evaluation"
    )
    log_to: tuple[Literal[SINKS], ...] = Field(
        ("tensorboard",),
        description="where metrics go besides RUN_DIR/metrics.jsonl: tensorboard (RUN_DIR/tensorboard/), "
        "wandb (Weights & Biases, `pip install 'marljax[wandb]'`; settings in `wandb`)",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    progress: bool = True
    sft_steps: int = Field(0, ge=0, description="supervised warm-up steps before RL")
    sft_lr: float | None = Field(
        None,
        gt=0,
        description="SFT's peak learning rate (a warm start usually wants a larger one than RL); "
        "None: each policy's optimizer.lr",
    )
    # SFT's optimiser: the policy's, with what these set changed
    sft_warmup_steps: int | None = Field(
        None,
        ge=0,
        description="SFT's linear warm-up to its peak rate; None: the policy's optimizer.warmup_steps",
    )
    sft_schedule: Literal["constant", "cosine"] | None = Field(
        None,
        description="SFT's rate after the warm-up: constant, or cosine decay over sft_steps to "
        "sft_min_lr_ratio of the peak (the warm start is not caught mid-oscillation); None: the policy's",
    )
    sft_min_lr_ratio: float | None = Field(
        None, ge=0, le=1, description="cosine: SFT's final rate as a fraction of its peak; None: the policy's"
    )
    sft_batch_size: int | None = Field(
        None, ge=1, description="SFT examples per policy and step; None: data.batch_size"
    )
    sft_teacher: SftTeacherConfig | None = Field(
        None,
        description="imitate a scripted teacher's turns instead of the problems' reference solutions "
        "(marljax.train.sft)",
    )
    log_rollouts: int = Field(
        0,
        ge=0,
        description="every N steps write each sample's prompt, completion, reward and advantage "
        "to RUN_DIR/rollouts/step_<step>.jsonl (read with `marljax rollouts`); 0 disables",
    )
    dynamic_sampling: DynamicSamplingConfig | None = Field(
        None,
        description="DAPO: train only on problems that teach, rolling out more until data.batch_size "
        "of them are collected (train/dynamic_sampling.py); true: the defaults; null: off",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, v):
        if isinstance(v, dict):
            raise_problems([((key,), why, v[key]) for key, why in RENAMED_TRAIN_KEYS.items() if key in v])
        return v

    @field_validator("log_to", mode="before")
    @classmethod
    def _one_sink(cls, v):
        # `log_to: wandb` means the list of that one
        return (v,) if isinstance(v, str) else v

    @field_validator("log_to")
    @classmethod
    def _each_once(cls, v):
        return tuple(dict.fromkeys(v))

    @field_validator("dynamic_sampling", mode="before")
    @classmethod
    def _dynamic_sampling_switch(cls, v):
        # `dynamic_sampling: true` switches it on with its defaults
        return ({} if v else None) if isinstance(v, bool) else v

    agent_grad_norms: bool = Field(
        False,
        description="log agent/<name>/grad_norm: the norm of the gradient of each agent's samples' loss "
        "alone, at each update (a diagnostic for agents sharing a policy; one more forward and "
        "backward pass per agent)",
    )
