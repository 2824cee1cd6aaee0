"""Typed run configuration: one YAML file (plus `dotted.key=value` overrides) -> `RunConfig`.

Every model forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Numbers are coerced laxly because YAML 1.1 reads `1e-6` as a
string; a string that is not a number is still an error. All problems are
reported together in one `ConfigError`, one per line, each naming the file
and the full dotted key.
"""

from __future__ import annotations

import copy
import difflib
import re
import string
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator, Field, Tag, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from marljax.kernels.losses import AGG_MODES, LOSS_TYPES
from marljax.kernels.losses_terms import KL_KINDS
from marljax.kernels.losses_tis import TIS_LEVELS
from marljax.models.config import PRESETS
from marljax.settings import StrictModel, resolve_annotation
from marljax.train.distributed import DistributedConfig
from marljax.workflows import REGISTRY
from marljax.workflows.grpo import GrpoConfig

__all__ = [
    "AgentConfig", "BufferConfig", "ConfigError", "DataConfig", "GrpoConfig", "LossConfig", "MeshConfig",
    "ModelSpec", "OptimizerConfig", "PolicyConfig", "RunConfig", "SamplerConfig", "SandboxSettings",
    "SyntheticData", "TrainSettings", "WorkflowConfig", "apply_overrides", "config_from_dict", "dump_config",
    "load_config",
]

# Policy and agent names become directory names, so keep them path-safe.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
TEMPLATE_FIELDS = ("role", "problem", "feedback", "history")
OVERRIDES = "<overrides>"


class ConfigError(ValueError):
    """Invalid configuration; `problems` holds one `<file>: <key>: <what is wrong>` line per problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in config:\n" + "\n".join(self.problems))


def _problems(found: list[tuple[tuple, str, Any]]) -> None:
    """Raise the cross-field problems `(sub-key, message, value)` of one model together.

    The sub-keys travel in the error context so that `config_from_dict` can
    name the exact field instead of the enclosing model.
    """
    if found:
        summary = "; ".join(f"{'.'.join(map(str, k)) or '<model>'}: {m}" for k, m, _ in found)
        raise PydanticCustomError("config", "{summary}", {"summary": summary, "problems": found})


def _check_name(name: str) -> str | None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        return "name must match [A-Za-z0-9_.-]+ and not be '.' or '..' (it becomes a directory name)"
    return None


def _check_format(template: str, allowed: Sequence[str]) -> str | None:
    """Why `template` is not a `str.format` string over the names `allowed` (None if it is)."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        return f"malformed format string: {e}"
    bad = sorted(n for n in names if n not in allowed)
    if bad:
        return (f"unknown placeholder {', '.join('{' + n + '}' for n in bad)}; "
                f"allowed: {', '.join('{' + n + '}' for n in allowed)}")
    try:  # catches what parse() lets through, e.g. placeholders nested in a format spec
        template.format(**{n: "" for n in allowed})
    except (ValueError, KeyError, IndexError) as e:
        return f"malformed format string: {e}"
    return None


_Model = StrictModel


class ModelSpec(_Model):
    path: str | None = Field(None, description="local Hugging Face checkpoint directory")
    preset: str | None = Field(None, description="random-init architecture from marljax.models.config.PRESETS")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="compute dtype")
    param_dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter storage dtype")
    tokenizer: str | None = Field(None, description="tokenizer directory; default: path")
    seed: int = Field(0, description="init seed for presets")
    remat: bool = Field(False, description="rematerialise decoder layers to save memory")
    scan_layers: bool = Field(True, description="run the layers under lax.scan (compiles independent of depth); "
                              "false unrolls them: faster steps on CPU, longer compiles")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v):
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset; known: {', '.join(PRESETS)}")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.preset is None):
            _problems([((), "set exactly one of path, preset", {"path": self.path, "preset": self.preset})])
        return self

    @property
    def tokenizer_dir(self) -> str | None:
        return self.tokenizer if self.tokenizer is not None else self.path


class OptimizerConfig(_Model):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(1e-6, gt=0, description="peak learning rate")
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 to lr")
    decay_steps: int | None = Field(None, gt=0, description="cosine decay length (required for cosine)")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final lr as a fraction of lr (cosine)")
    max_grad_norm: float | None = Field(1.0, gt=0, description="global-norm gradient clipping; None disables")

    @model_validator(mode="after")
    def _cosine_needs_decay(self):
        if self.schedule == "cosine" and self.decay_steps is None:
            _problems([(("decay_steps",), "schedule 'cosine' needs decay_steps", None)])
        return self


class LossConfig(_Model):
    type: Literal[LOSS_TYPES] = Field("ppo", description="policy-loss surrogate")
    clip_low: float = Field(0.2, gt=0, description="ratio clip below 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="ratio clip above 1 + clip_high (DAPO clip-higher)")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip constant for negative advantages")
    agg_mode: Literal[AGG_MODES] = Field("token-mean", description="how per-token losses are aggregated")
    norm_constant: float | None = Field(None, description="divisor for seq-mean-token-sum-norm")
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the reference model")
    kl_estimator: Literal[KL_KINDS] = "k3"
    tis_cap: float | None = Field(None, gt=0, description="truncated importance sampling cap; None disables TIS")
    tis_level: Literal[TIS_LEVELS] = "token"


class BufferConfig(_Model):
    threshold: int = Field(8, ge=1, description="samples that trigger an update")
    max_staleness: int | None = Field(None, ge=0, description="drop samples older than this many updates; None keeps all")


class MeshConfig(_Model):
    data: int = Field(1, ge=1)
    fsdp: int = Field(1, ge=1)
    tensor: int = Field(1, ge=1)
    devices: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="device ids for this policy; None = all devices (shared)")

    @model_validator(mode="after")
    def _devices_fill_mesh(self):
        if self.devices is not None:
            found = []
            if len(set(self.devices)) != len(self.devices):
                found.append((("devices",), "device ids repeat", self.devices))
            size = self.data * self.fsdp * self.tensor
            if len(self.devices) != size:
                found.append((("devices",), f"need data*fsdp*tensor = {size} devices", self.devices))
            _problems(found)
        return self


class PolicyConfig(_Model):
    model: ModelSpec
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    reference: bool = Field(False, description="keep a frozen copy of the initial model for the KL term")
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward/backward pass")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per update")
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    sampler_mesh: MeshConfig | None = Field(
        None, description="sampler layout if not the trainer's; parameters are resharded on device")

    @model_validator(mode="after")
    def _kl_needs_reference(self):
        if self.loss.kl_coef > 0 and not self.reference:
            _problems([(("reference",), f"loss.kl_coef = {self.loss.kl_coef} needs reference: true",
                        self.reference)])
        return self


class AgentConfig(_Model):
    policy: str = Field(description="name of the policy in `policies` this agent samples from and trains")
    role: str = Field("", description="role text substituted for {role}")
    template: str = Field("{role}{problem}", description="prompt; placeholders " + ", ".join(TEMPLATE_FIELDS))

    @field_validator("template")
    @classmethod
    def _template(cls, v):
        if (why := _check_format(v, TEMPLATE_FIELDS)) is not None:
            raise ValueError(why)
        return v


class SyntheticData(_Model):
    n_train: int = Field(64, ge=1)
    n_eval: int = Field(32, ge=0)
    difficulty: int = Field(1, ge=1, description="primitive operations per task (marljax.rewards.synthetic)")
    style: Literal["examples", "steps"] = Field(
        "examples", description="examples: infer f from input/output pairs; steps: up to `difficulty` "
                                "operations stated in words (the embedded demo's easier task)")
    seed: int = 0


class GridData(_Model):
    """Procedural grid path-planning problems (AT-GRPO's planning game, marljax.envs.grid)."""

    n_train: int = Field(64, ge=1)
    n_eval: int = Field(32, ge=0)
    size: int = Field(5, ge=3)
    seed: int = 0


# `schema` shadows a deprecated BaseModel method; the key name is part of the YAML format, so keep it.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*shadows an attribute in parent.*")

    class DataConfig(_Model):
        train: str | None = Field(None, description="training problems (JSONL)")
        eval: str | None = Field(None, description="evaluation problems (JSONL)")
        schema: Literal["auto", "humaneval", "mbpp", "stdio", "math"] = "auto"
        synthetic: SyntheticData | None = Field(None, description="generated tasks instead of a file")
        grid: GridData | None = Field(None, description="generated planning grids instead of a file")
        batch_size: int = Field(4, ge=1, description="problems per step")
        shuffle: bool = True
        seed: int = 0
        epochs: int | None = Field(None, ge=1, description="None repeats forever")

        @model_validator(mode="after")
        def _one_source(self):
            sources = {"train": self.train, "synthetic": self.synthetic and self.synthetic.model_dump(),
                       "grid": self.grid and self.grid.model_dump()}
            if sum(v is not None for v in sources.values()) != 1:
                _problems([((), "set exactly one of train, synthetic, grid", sources)])
            return self


class SamplerConfig(_Model):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables")
    max_prompt_len: int = Field(512, ge=1)
    min_prompt_bucket: int = Field(16, ge=1, description="smallest padded prompt length; larger = fewer compiles")
    min_batch_bucket: int = Field(1, ge=1, description="smallest padded batch; larger = fewer compiles")


# Workflow option models live beside their workflows (marljax.workflows.REGISTRY); `kind` picks one.
WORKFLOWS = tuple(settings for settings, _ in REGISTRY.values())
WORKFLOW_KINDS = tuple(m.model_fields["kind"].default for m in WORKFLOWS)


def _workflow_kind(v: Any) -> Any:
    # A mapping without `kind` means the default workflow, as the field default does.
    return v.get("kind", WORKFLOW_KINDS[0]) if isinstance(v, dict) else getattr(v, "kind", None)


WorkflowConfig = Annotated[Union[tuple(Annotated[m, Tag(k)] for m, k in zip(WORKFLOWS, WORKFLOW_KINDS))],
                           Discriminator(_workflow_kind)]


class SandboxSettings(_Model):
    workers: int | None = Field(None, ge=1, description="parallel test processes; None = CPU count + 1")
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: int = Field(512, ge=1)


class TrainSettings(_Model):
    steps: int = Field(100, ge=1)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    async_checkpoint: bool = True
    log_every: int = Field(1, ge=1)
    eval_every: int | None = Field(None, ge=1, description="None disables evaluation")
    tensorboard: bool = True
    progress: bool = True
    sft_steps: int = Field(0, ge=0, description="supervised warm-up steps before RL")


class RunConfig(_Model):
    name: str = "run"
    run_dir: str = Field("runs/{name}", description="output directory; {name} is replaced by name")
    seed: int = 0
    policies: dict[str, PolicyConfig] = Field(min_length=1)
    agents: dict[str, AgentConfig] = Field(min_length=1)
    data: DataConfig
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    workflow: WorkflowConfig = Field(default_factory=GrpoConfig)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if (why := _check_name(v)) is not None:
            raise ValueError(why)
        return v

    @field_validator("run_dir")
    @classmethod
    def _run_dir(cls, v):
        if (why := _check_format(v, ("name",))) is not None:
            raise ValueError(why)
        return v

    @field_validator("policies", "agents")
    @classmethod
    def _names(cls, v):
        _problems([((k,), why, k) for k in v if (why := _check_name(k)) is not None])
        return v

    @model_validator(mode="after")
    def _references(self):
        found = []
        known = ", ".join(self.policies)
        for name, agent in self.agents.items():
            if agent.policy not in self.policies:
                found.append((("agents", name, "policy"), f"unknown policy {agent.policy!r}; known: {known}",
                              agent.policy))
        found += [(("workflow", *key), msg, value) for key, msg, value in self.workflow.check_agents(self.agents)]
        _problems(found)
        return self

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir.format(name=self.name))


# ---------------------------------------------------------------- loading


def _split_override(item: str) -> tuple[tuple[str, ...], Any]:
    key, eq, raw = item.partition("=")
    parts = tuple(p.strip() for p in key.split("."))
    if not eq:
        raise ValueError("expected dotted.key=value")
    if not all(parts):
        raise ValueError("empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # e.g. a template `{role}: {problem}` is not valid YAML; take it verbatim
    return parts, value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict:
    """A copy of `data` with each `dotted.key=value` set in order (value parsed as YAML)."""
    out = copy.deepcopy(dict(data))
    errors = []
    for item in overrides:
        try:
            parts, value = _split_override(item)
        except ValueError as e:
            errors.append(f"{OVERRIDES}: {item.partition('=')[0] or '<empty>'}: {e} (got {item!r})")
            continue
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:  # absent or explicit null: create the mapping
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(f"{OVERRIDES}: {'.'.join(parts[:i + 1])}: cannot set {'.'.join(parts[i + 1:])!r} "
                              f"inside a non-mapping value (got {child!r})")
                break
            node = child
        else:
            node[parts[-1]] = value
    if errors:
        raise ConfigError(errors)
    return out


_resolve = resolve_annotation


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc`, if it can be told from the schema."""
    tp: Any = RunConfig
    for part in loc:
        tp = _resolve(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        else:
            return None
    tp = _resolve(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _exists(data: Any, loc: Sequence[Any]) -> int:
    """How many leading parts of `loc` exist in `data`."""
    for n, part in enumerate(loc):
        if not isinstance(data, dict) or part not in data:
            return n
        data = data[part]
    return len(loc)


def _lines(err: ValidationError, source: str, original: Any, touched: Sequence[tuple]) -> list[str]:
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        if len(loc) >= 2 and loc[0] == "workflow" and loc[1] in WORKFLOW_KINDS:
            del loc[1]  # pydantic puts the union tag in the path; the YAML has no such level
        if e["type"] == "config":  # our cross-field checks: expand each with its own key
            found = [(loc + list(sub), msg, value, True) for sub, msg, value in e["ctx"]["problems"]]
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            if isinstance(e["input"], dict):
                found = [(loc + ["kind"], f"unknown workflow kind; known: {', '.join(WORKFLOW_KINDS)}",
                          e["input"].get("kind"), True)]
            else:
                found = [(loc, "expected a mapping", e["input"], True)]
        elif e["type"] == "missing":
            found = [(loc, "missing required key", None, False)]
        elif e["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = "unknown key"
            if model is not None:
                fields = list(model.model_fields)
                close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
                msg += f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(fields)}"
            found = [(loc, msg, e["input"], True)]
        else:
            msg = e["msg"].removeprefix("Value error, ")
            found = [(loc, msg, e["input"], True)]
        for key, msg, value, show in found:
            # Blame the overrides when the key, or the new subtree holding it, came from one.
            n = _exists(original, key)
            from_override = any(tuple(key[:len(t)]) == t or (n < len(key) and tuple(key[:n + 1]) == t[:n + 1])
                                for t in touched)
            where = OVERRIDES if from_override else source
            dotted = ".".join(map(str, key)) or "<root>"
            lines.append(f"{where}: {dotted}: {msg}" + (f" (got {_short(value)})" if show else ""))
    return lines


def _validate(data: Any, source: str, original: Any = None, touched: Sequence[tuple] = ()) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: <root>: expected a mapping of settings (got {_short(data)})"])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_lines(err, source, data if original is None else original, touched)) from None


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain mapping (as read from YAML) into a `RunConfig`; errors name `source`."""
    return _validate(dict(data) if isinstance(data, Mapping) else data, source)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply `dotted.key=value` overrides in order, and validate."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError([f"{source}: <root>: cannot read file: {e.strerror or e}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<root>"
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{source}: {where}: YAML syntax error: {what}"]) from None
    if data is None:
        data = {}  # an empty file: report the missing keys rather than "not a mapping"
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: <root>: expected a mapping of settings (got {_short(data)})"])
    merged = apply_overrides(data, overrides)
    touched = [_split_override(o)[0] for o in overrides]
    return _validate(merged, source, data, touched)


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write `cfg` as YAML that `load_config` reads back into an equal config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=False))
