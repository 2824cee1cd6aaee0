"""Run configuration: YAML loading, overrides, validation errors that name file and key, round trip."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from marljax.train.config import (
    ConfigError,
    GrpoConfig,
    LossConfig,
    OptimizerConfig,
    RunConfig,
    apply_overrides,
    config_from_dict,
    dump_config,
    load_config,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

MINIMAL = {
    "policies": {"main": {"model": {"preset": "tiny-qwen3"}}},
    "agents": {"solver": {"policy": "main"}},
    "data": {"source": {"kind": "synthetic"}},
}


def write(tmp_path, data, name="run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_(**changes) -> dict:
    """MINIMAL with dotted-path changes, e.g. with_(**{"train.steps": 0})."""
    return apply_overrides(
        MINIMAL,
        [
            f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
            if not isinstance(v, str)
            else f"{k}={v}"
            for k, v in changes.items()
        ],
    )


def problems(tmp_path, data, overrides=()) -> list[str]:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


def only_problem(tmp_path, data, overrides=()) -> str:
    found = problems(tmp_path, data, overrides)
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------ shipped configs


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_load(name):
    from marljax.workflows import build_workflow

    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, RunConfig)
    assert all(a.policy in cfg.policies for a in cfg.agents.values())
    assert build_workflow(cfg.workflow) is not None


def test_tiny_config_values():
    cfg = load_config(CONFIGS / "grpo_tiny.yaml")
    pol = cfg.policies["main"]
    assert pol.model.preset == "tiny-qwen3" and pol.model.path is None
    assert pol.optimizer.lr == 1e-3 and pol.optimizer.schedule == "constant"
    assert pol.buffer.threshold == 16 and pol.micro_batch_size == 16
    assert cfg.data.source.kind == "synthetic" and cfg.data.source.n_train == 32
    assert cfg.workflow.group_size == 4 and cfg.train.steps == 30 and cfg.train.save_every == 10
    assert cfg.sampler.max_new_tokens == 32


def test_qwen_config_values():
    cfg = load_config(CONFIGS / "grpo_qwen2.5-0.5b.yaml")
    pol = cfg.policies["main"]
    assert pol.model.path == "checkpoints/Qwen2.5-0.5B-Instruct" and pol.model.dtype == "bfloat16"
    assert pol.model.tokenizer_dir == pol.model.path
    assert pol.optimizer.lr == 1e-6 and pol.optimizer.schedule == "cosine"
    assert (pol.optimizer.warmup_steps, pol.optimizer.decay_steps) == (10, 1000)
    assert pol.loss.kl_coef == 0.001 and pol.reference
    assert pol.mesh.fsdp == 8
    assert cfg.data.source.schema == "mbpp" and cfg.data.batch_size == 32
    assert cfg.workflow.group_size == 8 and cfg.sampler.max_new_tokens == 512


# ------------------------------------------------------------------ defaults


def test_defaults():
    cfg = config_from_dict(MINIMAL)
    pol = cfg.policies["main"]
    assert (pol.model.dtype, pol.model.param_dtype, pol.model.remat) == ("float32", "float32", "none")
    assert pol.optimizer == OptimizerConfig()
    assert (pol.optimizer.name, pol.optimizer.lr, pol.optimizer.max_grad_norm) == ("adamw", 1e-6, 1.0)
    assert (pol.loss.type, pol.loss.agg_mode, pol.loss.kl_estimator, pol.loss.tis_level) == (
        "ppo",
        "token-mean",
        "k3",
        "token",
    )
    assert pol.loss.tis_cap is None and not pol.reference
    assert pol.buffer.threshold == 8 and pol.buffer.max_staleness is None
    assert (pol.micro_batch_size, pol.mini_batches) == (8, 1)
    assert (pol.mesh.data, pol.mesh.fsdp, pol.mesh.tensor, pol.mesh.devices) == (1, 1, 1, None)
    assert cfg.agents["solver"].template == "{role}{problem}" and cfg.agents["solver"].role == ""
    assert cfg.data.batch_size == 4 and cfg.data.source.n_eval == 32 and cfg.data.source.seed == 0
    assert cfg.workflow == GrpoConfig() and cfg.workflow.kind == "grpo"
    assert cfg.sampler.top_p == 1.0 and cfg.sandbox.timeout_s == 5.0
    assert cfg.train.steps == 100 and cfg.train.eval_every is None
    assert cfg.name == "run" and cfg.resolved_run_dir() == Path("runs/run")


def test_yaml_11_exponent_string_becomes_float(tmp_path):
    # PyYAML reads `1e-6` (no dot) as a string; lax coercion makes it a float.
    text = yaml.safe_dump(MINIMAL) + "seed: 3\n"
    text = text.replace("preset: tiny-qwen3", "preset: tiny-qwen3\n    optimizer: {lr: 1e-6}")
    cfg = load_config(write(tmp_path, text))
    assert cfg.policies["main"].optimizer.lr == 1e-6


def test_workflow_without_kind_is_grpo():
    cfg = config_from_dict(with_(**{"workflow.group_size": 6}))
    assert cfg.workflow.kind == "grpo" and cfg.workflow.group_size == 6


# ------------------------------------------------------------------ errors name file and key


@pytest.mark.parametrize(
    "key",
    [
        "bogus",
        "train.bogus",
        "policies.main.optimizer.lrx",
        "policies.main.model.bogus",
        "policies.main.mesh.bogus",
        "data.source.bogus",
        "workflow.bogus",
    ],
)
def test_unknown_key_at_any_depth(tmp_path, key):
    msg = only_problem(tmp_path, with_(**{key: 1}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: {key}: unknown key"), msg


def test_unknown_key_suggests_close_match(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.optimizer.lrx": 1}))
    assert "did you mean 'lr'" in msg


def test_wrong_type(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.optimizer.lr": "fast"}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: policies.main.optimizer.lr: ")
    assert "'fast'" in msg


def test_boolean_is_not_a_number(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.optimizer.lr": True}))
    assert ": policies.main.optimizer.lr: expected a number, not a boolean (got True)" in msg
    assert config_from_dict(with_(**{"policies.main.model.remat": True})).policies["main"].model.remat


def test_model_runtime_options_reach_the_model_config():
    from marljax.train.policy import load_model

    spec = (
        config_from_dict(
            with_(**{"policies.main.model.scan_layers": False, "policies.main.model.remat": True})
        )
        .policies["main"]
        .model
    )
    config = load_model(spec)[0]
    assert (config.scan_layers, config.remat) == (False, "full")
    assert load_model(config_from_dict(with_()).policies["main"].model)[0].scan_layers is True  # the default


def test_wrong_type_for_section(tmp_path):
    msg = only_problem(tmp_path, with_(**{"sampler": 5}))
    assert ": sampler: " in msg and "(got 5)" in msg


@pytest.mark.parametrize(
    "key,value",
    [
        ("policies.main.optimizer.lr", 0),
        ("policies.main.optimizer.min_lr_ratio", 1.5),
        ("policies.main.loss.dual_clip", 1.0),
        ("policies.main.buffer.threshold", 0),
        ("policies.main.loss.agg_mode", "mean"),
        ("sampler.top_p", 0),
        ("workflow.group_size", 1),
        ("train.steps", 0),
    ],
)
def test_out_of_range(tmp_path, key, value):
    msg = only_problem(tmp_path, with_(**{key: value}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: {key}: "), msg
    assert f"(got {value!r})" in msg


@pytest.mark.parametrize("drop,key", [("data", "data"), ("agents", "agents")])
def test_missing_required(tmp_path, drop, key):
    data = copy.deepcopy(MINIMAL)
    del data[drop]
    assert only_problem(tmp_path, data) == f"{tmp_path / 'run.yaml'}: {key}: missing required key"


def test_missing_required_nested(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main": {}}))
    # a policy has a model of its own or (an adapter policy) the base of another policy
    assert msg == (
        f"{tmp_path / 'run.yaml'}: policies.main.model: set exactly one of model, base "
        "(got {'model': None, 'base': None})"
    )
    msg = only_problem(tmp_path, with_(**{"policies.main": {"micro_batch_size": 8}}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: policies.main.model: set exactly one of model, base")


def test_model_needs_exactly_one_source(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.model.path": "/ckpt"}))
    assert ": policies.main.model: set exactly one of path, preset" in msg


def test_unknown_preset(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.model.preset": "huge"}))
    assert ": policies.main.model.preset: unknown preset" in msg and "tiny-qwen3" in msg


def test_data_source_kind_must_be_registered(tmp_path):
    msg = only_problem(tmp_path, with_(**{"data.source.kind": "riddles"}))
    assert ": data.source.kind: unknown data source; known: " in msg and "jsonl" in msg, msg
    msg = only_problem(tmp_path, {**MINIMAL, "data": {"source": {"train": "x.jsonl"}}})
    assert ": data.source.kind: missing required key; known: " in msg, msg
    msg = only_problem(tmp_path, with_(**{"data.source": "{kind: jsonl}"}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: data.source.train: missing required key"), msg


@pytest.mark.parametrize(
    "old, kind",
    [
        ({"synthetic": {"n_train": 8}}, "synthetic"),
        ({"grid": {}}, "grid"),
        ({"train": "x.jsonl", "eval": "y.jsonl"}, "jsonl"),
        ({"train": "x.jsonl", "schema": "qa"}, "qa"),
    ],
)
def test_old_data_form_says_what_to_write(tmp_path, old, kind):
    msg = only_problem(tmp_path, {**MINIMAL, "data": {**old, "batch_size": 2}})
    assert f": data: old form ({', '.join(old)}); write `source: {{kind: {kind}, ...}}`" in msg, msg


def test_unknown_policy_reference(tmp_path):
    msg = only_problem(tmp_path, with_(**{"agents.solver.policy": "x"}))
    assert msg == f"{tmp_path / 'run.yaml'}: agents.solver.policy: unknown policy 'x'; known: main (got 'x')"


@pytest.mark.parametrize("template", ["{role}{answer}", "{0}", "{}", "{problem", "{problem:{x}}"])
def test_bad_template(tmp_path, template):
    msg = only_problem(tmp_path, with_(**{"agents.solver.template": repr(template)}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: agents.solver.template: "), msg


def test_good_template_placeholders():
    cfg = config_from_dict(with_(**{"agents.solver.template": "'{role}|{problem}|{feedback}|{history}'"}))
    assert cfg.agents["solver"].template.count("{") == 4


def test_cosine_without_decay_steps(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.optimizer.schedule": "cosine"}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: policies.main.optimizer.decay_steps: ")
    assert "cosine" in msg


def test_kl_without_reference(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.loss.kl_coef": 0.01}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: policies.main.reference: ")
    cfg = config_from_dict(with_(**{"policies.main.loss.kl_coef": 0.01, "policies.main.reference": True}))
    assert cfg.policies["main"].reference


def test_bad_policy_name(tmp_path):
    data = copy.deepcopy(MINIMAL)
    data["policies"]["a/b"] = data["policies"].pop("main")
    data["agents"]["solver"]["policy"] = "a/b"
    msg = only_problem(tmp_path, data)
    assert ": policies.a/b: name must match" in msg


def test_workflow_agent_checks(tmp_path):
    msg = only_problem(tmp_path, with_(**{"workflow.agent": "critic"}))
    assert ": workflow.agent: unknown agent" in msg
    two = with_(**{"agents.critic": {"policy": "main"}})
    assert ": workflow.agent: " in only_problem(tmp_path, two)
    assert config_from_dict(apply_overrides(two, ["workflow.agent=critic"])).workflow.agent == "critic"


def test_unknown_workflow_kind(tmp_path):
    msg = only_problem(tmp_path, with_(**{"workflow.kind": "ppo"}))
    from marljax.workflows import REGISTRY

    assert f": workflow.kind: unknown workflow kind; known: {', '.join(REGISTRY)} (got 'ppo')" in msg


def test_mesh_devices_must_fill_mesh(tmp_path):
    msg = only_problem(tmp_path, with_(**{"policies.main.mesh.fsdp": 2, "policies.main.mesh.devices": [0]}))
    assert ": policies.main.mesh.devices: need data*fsdp*tensor (x dcn) = 2 devices" in msg


def test_multiple_errors_reported_together(tmp_path):
    data = with_(
        **{
            "train.steps": 0,
            "sampler.bogus": 1,
            "agents.solver.policy": "x",
            "policies.main.optimizer.lr": "fast",
        }
    )
    found = problems(tmp_path, data)
    keys = sorted(line.split(": ")[1] for line in found)
    assert keys == ["policies.main.optimizer.lr", "sampler.bogus", "train.steps"]
    # cross-field checks in different sections are reported together too
    found = problems(tmp_path, with_(**{"data.train": "x.jsonl", "policies.main.loss.kl_coef": 1}))
    assert [line.split(": ")[1] for line in found] == ["policies.main.reference", "data"]
    assert str(ConfigError(found)).splitlines()[1:] == found


def test_config_from_dict_names_source():
    with pytest.raises(ConfigError, match=r"^1 problem in config:\nmine.yaml: train.steps: "):
        config_from_dict(with_(**{"train.steps": 0}), source="mine.yaml")
    with pytest.raises(ConfigError, match="<root>: expected a mapping"):
        config_from_dict([1, 2])


# ------------------------------------------------------------------ YAML problems


def test_yaml_syntax_error_reports_line(tmp_path):
    msg = only_problem(tmp_path, "name: a\nseed: 1\npolicies: [1, 2\nagents: {}\n")
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: line ")
    assert "YAML syntax error" in msg
    line = int(msg.split("line ")[1].split(",")[0])
    assert 3 <= line <= 5


def test_non_mapping_top_level(tmp_path):
    msg = only_problem(tmp_path, "- 1\n- 2\n")
    assert msg == f"{tmp_path / 'run.yaml'}: <root>: expected a mapping of settings (got [1, 2])"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "nope.yaml")


# ------------------------------------------------------------------ overrides


def test_overrides_parse_values(tmp_path):
    path = write(tmp_path, MINIMAL)
    cfg = load_config(
        path,
        [
            "policies.main.optimizer.lr=1e-6",  # a YAML 1.1 string, coerced
            "policies.main.mesh.devices=[0]",
            "policies.main.optimizer.max_grad_norm=null",
            "policies.main.model.remat=true",
            "train.steps=5",
            "train.steps=7",  # applied in order
            "agents.solver.template={role}: {problem}",  # not valid YAML: taken verbatim
        ],
    )
    pol = cfg.policies["main"]
    assert pol.optimizer.lr == 1e-6 and isinstance(pol.optimizer.lr, float)
    assert pol.mesh.devices == [0]
    assert pol.optimizer.max_grad_norm is None
    assert pol.model.remat == "full"  # true: the named policy "full"
    assert cfg.train.steps == 7
    assert cfg.agents["solver"].template == "{role}: {problem}"


def test_override_adds_new_policy(tmp_path):
    path = write(tmp_path, MINIMAL)
    cfg = load_config(path, ["policies.critic.model.preset=tiny-qwen2", "agents.solver.policy=critic"])
    assert set(cfg.policies) == {"main", "critic"} and cfg.agents["solver"].policy == "critic"
    # a new entry is validated like any other, and its errors are blamed on the overrides
    msg = only_problem(tmp_path, MINIMAL, ["policies.critic.model.presetx=tiny-qwen2"])
    assert msg.startswith("<overrides>: policies.critic.model.presetx: unknown key"), msg


def test_override_of_a_misspelt_policy_or_agent_names_the_real_one(tmp_path):
    msg = only_problem(tmp_path, MINIMAL, ["policies.mian.optimizer.lr=1e-5"])
    assert msg == (
        "<overrides>: policies.mian: no policy 'mian' in the config; did you mean 'main'? "
        "(a new one needs a name unlike the others')"
    ), msg
    msg = only_problem(tmp_path, MINIMAL, ["agents.solvr.policy=main"])
    assert msg.startswith("<overrides>: agents.solvr: no agent 'solvr' in the config; did you mean 'solver'?")


def test_override_errors_blame_overrides(tmp_path):
    msg = only_problem(tmp_path, MINIMAL, ["train.steps=0"])
    assert msg == "<overrides>: train.steps: Input should be greater than or equal to 1 (got 0)"
    msg = only_problem(tmp_path, MINIMAL, ["train.stepz=3"])
    assert msg.startswith("<overrides>: train.stepz: unknown key")
    # a problem already in the file still names the file
    msg = only_problem(tmp_path, with_(**{"train.steps": 0}), ["train.save_every=2"])
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: train.steps: ")


@pytest.mark.parametrize("bad", ["train.steps", "=3", "train..steps=3", ".x=1"])
def test_bad_override_syntax(tmp_path, bad):
    msg = only_problem(tmp_path, MINIMAL, [bad])
    assert msg.startswith("<overrides>: "), msg


def test_override_into_scalar(tmp_path):
    msg = only_problem(tmp_path, with_(**{"train.steps": 5}), ["train.steps.x=1"])
    assert msg.startswith("<overrides>: train.steps: cannot set 'x' inside a non-mapping value"), msg


def test_apply_overrides_is_pure():
    data = copy.deepcopy(MINIMAL)
    out = apply_overrides(data, ["train.steps=3", "policies.main.model.seed=2"])
    assert data == MINIMAL
    assert out["train"] == {"steps": 3} and out["policies"]["main"]["model"]["seed"] == 2
    # an explicit null becomes a mapping when a key is set under it
    assert apply_overrides({"data": {"synthetic": None}}, ["data.synthetic.seed=1"]) == {
        "data": {"synthetic": {"seed": 1}}
    }


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_dump_load_round_trip(tmp_path, name):
    first = sorted(load_config(CONFIGS / name).policies)[0]
    cfg = load_config(CONFIGS / name, [f"policies.{first}.optimizer.lr=1e-7", "seed=7"])
    out = tmp_path / "sub" / "config.yaml"
    dump_config(cfg, out)
    again = load_config(out)
    assert again == cfg
    assert again.model_dump() == cfg.model_dump()


def test_run_dir_format(tmp_path):
    cfg = config_from_dict(with_(**{"name": "exp1", "run_dir": "out/{name}/x"}))
    assert cfg.resolved_run_dir() == Path("out/exp1/x")
    msg = only_problem(tmp_path, with_(**{"run_dir": "out/{user}"}))
    assert ": run_dir: unknown placeholder {user}" in msg


# ------------------------------------------------------------------ frozen settings


def test_settings_are_frozen_and_equal_settings_are_equal_keys():
    a, b = config_from_dict(MINIMAL), config_from_dict(copy.deepcopy(MINIMAL))
    loss, optimizer = a.policies["main"].loss, a.policies["main"].optimizer
    assert loss == b.policies["main"].loss and hash(loss) == hash(b.policies["main"].loss)
    assert optimizer == b.policies["main"].optimizer and hash(optimizer) == hash(b.policies["main"].optimizer)
    assert OptimizerConfig(lr=1e-3) != OptimizerConfig(lr=2e-3)
    cache = {(optimizer, loss): "compiled step"}
    assert cache[b.policies["main"].optimizer, b.policies["main"].loss] == "compiled step"
    with pytest.raises(ValidationError, match="frozen"):
        loss.clip_high = 0.3
    with pytest.raises(ValidationError, match="frozen"):
        a.train = b.train


def test_loss_config_gives_the_policy_loss_options():
    cfg = LossConfig(
        type="gspo",
        clip_low=3e-4,
        clip_high=4e-4,
        agg_mode="seq-mean-token-sum-norm",
        norm_constant=64.0,
        kl_coef=0.1,
    )
    assert cfg.policy_loss_options() == {
        "loss_type": "gspo",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "dual_clip": None,
        "agg_mode": "seq-mean-token-sum-norm",
        "norm_constant": 64.0,
    }
    # the norm constant goes only where the aggregation divides by it
    assert LossConfig(norm_constant=64.0).policy_loss_options()["norm_constant"] is None


@pytest.mark.parametrize("damage", [b"\xff\xfe not utf-8", b"train: [unclosed", b"- a list", b""])
def test_an_unreadable_config_record_is_set_aside_not_a_dead_end(tmp_path, damage):
    """Old code raised (UnicodeDecodeError, a YAML error, or a ConfigError listing every key as
    changed) on every rerun until the file was mended by hand."""
    from marljax.train.config import config_to_record

    run = tmp_path / "run"
    run.mkdir()
    first = config_from_dict(with_(**{"train.steps": 5}))
    dump_config(first, run / "config.yaml")
    longer = config_from_dict(with_(**{"train.steps": 9}))
    dump_config(longer, run / "config-T3.yaml")
    (run / "config-T3.yaml").write_bytes(damage)
    with pytest.warns(RuntimeWarning, match="config-T3.yaml") as caught:
        # compared with the newest readable record, config.yaml: more steps resume the run
        assert config_to_record(longer, run, "T4") == run / "config-T4.yaml"
    (kept,) = (run / "set_aside").iterdir()
    assert kept.read_bytes() == damage and str(kept) in str(caught[0].message)
    (run / "config.yaml").write_bytes(damage)
    with pytest.warns(RuntimeWarning, match="config.yaml"):
        assert config_to_record(first, run, "T5") == run / "config.yaml"  # nothing left to compare with


def test_dump_config_replaces_the_record_whole(tmp_path, monkeypatch):
    """A kill while config.yaml is written must leave the old record or the new one: old code
    wrote in place, and a torn record refused every rerun."""
    replaced = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append(Path(b)), real(a, b)))
    dump_config(config_from_dict(with_()), tmp_path / "config.yaml")
    assert replaced == [tmp_path / "config.yaml"]


def test_a_run_directory_keeps_its_configs_and_refuses_another_runs(tmp_path):
    from marljax.train.config import config_to_record

    run = tmp_path / "run"
    run.mkdir()
    first = config_from_dict(with_(**{"train.steps": 5}))
    assert config_to_record(first, run, "T1") == run / "config.yaml"  # a new run: its starting config
    dump_config(first, run / "config.yaml")
    assert config_to_record(first, run, "T2") is None  # the same settings: nothing to record
    # more steps resume the same run: recorded beside the original, which stays as it was
    longer = config_from_dict(with_(**{"train.steps": 9}))
    assert config_to_record(longer, run, "T3") == run / "config-T3.yaml"
    dump_config(longer, run / "config-T3.yaml")
    assert config_to_record(longer, run, "T4") is None  # compared with the newest recorded one
    # one directory named relatively or absolutely is the same setting
    moved = config_from_dict(with_(**{"train.steps": 9, "run_dir": str(run)}))
    dump_config(moved, run / "config-T4.yaml")
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert (
            config_to_record(config_from_dict(with_(**{"train.steps": 9, "run_dir": "run"})), run, "T5")
            is None
        )
    finally:
        os.chdir(here)
    (run / "config-T4.yaml").unlink()
    other = config_from_dict(
        with_(**{"train.steps": 9, "policies.main.model.preset": "tiny-llama", "seed": 2})
    )
    with pytest.raises(ConfigError) as e:
        config_to_record(other, run, "T5")
    problems = e.value.problems
    assert (
        f"{run}: policies.main.model.preset: 'tiny-qwen3' in the run's config-T3.yaml, 'tiny-llama' now"
        in problems
    )
    assert f"{run}: seed: 0 in the run's config-T3.yaml, 2 now" in problems
    assert sorted(p.name for p in run.iterdir()) == ["config-T3.yaml", "config.yaml"]


def test_a_record_from_before_a_new_setting_resumes_and_a_cut_record_is_set_aside(tmp_path):
    """Settings added to marljax after a run began take their defaults in the comparison (the old
    code compared a missing key as None and refused the resume of every earlier run directory);
    a record cut short, even into valid YAML, is damage: set aside, not a dead end."""
    from marljax.train.config import config_to_record

    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_dict(with_(**{"train.steps": 5}))
    dump_config(cfg, run / "config.yaml")
    record = yaml.safe_load((run / "config.yaml").read_text())
    (name,) = record["policies"]
    del record["policies"][name]["mini_batches"]  # as if written before mini_batches existed
    del record["train"]["sft_lr"]
    (run / "config.yaml").write_text(yaml.safe_dump(record))
    assert config_to_record(cfg, run, "T1") is None  # nothing changed: the run resumes as it was
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text[: text.index("policies:")])  # cut short, still a mapping
    with pytest.warns(RuntimeWarning, match="config.yaml"):
        assert config_to_record(cfg, run, "T2") == run / "config.yaml"
    assert len(list((run / "set_aside").iterdir())) == 1


# ------------------------------------------------------------------ metrics sinks and renamed keys


def test_log_to_names_the_sinks():
    assert config_from_dict(MINIMAL).train.log_to == ("tensorboard",)
    assert config_from_dict(with_(**{"train.log_to": []})).train.log_to == ()
    assert config_from_dict(with_(**{"train.log_to": "wandb"})).train.log_to == (
        "wandb",
    )  # one: no list needed
    both = config_from_dict(with_(**{"train.log_to": ["wandb", "tensorboard", "wandb"]}))
    assert both.train.log_to == ("wandb", "tensorboard")
    # the override form the tests and the README use
    assert load_config(CONFIGS / "grpo_tiny.yaml", ["train.log_to=[]"]).train.log_to == ()
    wandb = config_from_dict(with_(**{"train.wandb.project": "p", "train.wandb.mode": "offline"})).train.wandb
    assert (wandb.project, wandb.entity, wandb.mode) == ("p", None, "offline")


def test_an_unknown_sink_names_the_key(tmp_path):
    msg = only_problem(tmp_path, with_(**{"train.log_to": ["tensorboard", "mlflow"]}))
    assert msg.startswith(
        f"{tmp_path / 'run.yaml'}: train.log_to.1: Input should be 'tensorboard' or 'wandb'"
    )


@pytest.mark.parametrize(
    "key, value, new",
    [
        ("train.tensorboard", False, "renamed to train.log_to, a list: `log_to: [tensorboard]` for true"),
        ("train.max_sampling_rounds", 4, "renamed to train.dynamic_sampling.max_rounds"),
    ],
)
def test_a_renamed_key_names_its_new_one(tmp_path, key, value, new):
    msg = only_problem(tmp_path, with_(**{key: value}))
    assert msg.startswith(f"{tmp_path / 'run.yaml'}: {key}: {new}"), msg


def _record(run: Path, cfg, **train) -> None:
    """Write `cfg` as a record of an older version, whose `train` held no log_to or wandb and the
    keys `train` (in place of today's)."""
    record = cfg.model_dump(mode="json")
    del record["train"]["log_to"], record["train"]["wandb"]
    record["train"].update(train)
    (run / "config.yaml").write_text(yaml.safe_dump(record))


@pytest.mark.parametrize(
    "old, now",
    [
        ({"tensorboard": True}, {}),
        ({"tensorboard": False}, {"train.log_to": []}),
        ({"tensorboard": True, "dynamic_sampling": False, "max_sampling_rounds": 3}, {}),
        # that version's filter and its fallback when no problem taught, in today's words
        (
            {"tensorboard": True, "dynamic_sampling": True, "max_sampling_rounds": 5},
            {"train.dynamic_sampling": {"keep": "advantage", "max_rounds": 5, "when_none": "train"}},
        ),
    ],
)
def test_a_record_with_keys_renamed_since_resumes_by_its_settings(tmp_path, old, now):
    from marljax.train.config import config_to_record

    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_dict(with_(**now))
    _record(run, cfg, **old)
    assert config_to_record(cfg, run, "T1") is None  # the same settings: the run resumes as it was
    assert not (run / "set_aside").exists()
    # and its sinks may change on a resume, as what it logs may
    more = config_from_dict(
        with_(**{**now, "train.log_to": ["tensorboard", "wandb"], "train.wandb.mode": "offline"})
    )
    assert config_to_record(more, run, "T2") == run / "config-T2.yaml"


def test_a_record_of_the_old_dynamic_sampling_refuses_todays_defaults(tmp_path):
    from marljax.train.config import config_to_record

    run = tmp_path / "run"
    run.mkdir()
    _record(run, config_from_dict(MINIMAL), tensorboard=True, dynamic_sampling=True, max_sampling_rounds=5)
    with pytest.raises(ConfigError) as e:
        config_to_record(config_from_dict(with_(**{"train.dynamic_sampling": True})), run, "T1")
    assert e.value.problems[:3] == [
        f"{run}: train.dynamic_sampling.keep: 'advantage' in the run's config.yaml, 'accuracy' now",
        f"{run}: train.dynamic_sampling.max_rounds: 5 in the run's config.yaml, 3 now",
        f"{run}: train.dynamic_sampling.when_none: 'train' in the run's config.yaml, 'skip' now",
    ]


def test_the_sampler_fits_its_decode_batch_to_the_rows_on_a_cpu_only_unless_told():
    from marljax.train.config import SamplerConfig

    default = SamplerConfig(slots=16, share_prefixes=False)
    assert default.schedule("cpu").shrink
    assert not default.schedule("gpu").shrink and not default.schedule("tpu").shrink
    assert (default.schedule("tpu").slots, default.schedule("tpu").share_prefixes) == (16, False)
    assert not SamplerConfig(shrink=False).schedule("cpu").shrink
    assert SamplerConfig(shrink=True).schedule("tpu").shrink


def test_the_sampler_reads_cache_windows_unless_told_not_to():
    from marljax.sampler import Buckets
    from marljax.train.config import SamplerConfig

    assert SamplerConfig(min_prompt_bucket=32, min_batch_bucket=8).buckets() == Buckets(
        min_prompt=32, min_batch=8
    )
    assert SamplerConfig().buckets().min_window == Buckets().min_window == 64
    assert SamplerConfig(windows=False).buckets() == Buckets(min_window=None)
