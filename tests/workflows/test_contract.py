"""The workflow contract: typed config, abstract methods, the registry, and the Rollout's common metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import Field, ValidationError

from marljax import kernels
from marljax.train.config import config_from_dict
from marljax.workflows import REGISTRY, build_workflow
from marljax.workflows.base import BaseWorkflowConfig, Workflow, register_workflow
from marljax.workflows.types import Generation, Rollout, agent_metrics


class EchoConfig(BaseWorkflowConfig):
    kind: Literal["echo"] = "echo"
    group_size: int = Field(4, ge=2)
    note: str = "hi"


class Echo(Workflow[EchoConfig]):
    def play(self, problems, agents, generator, verifier, seed):
        raise NotImplementedError

    def credit(self, episodes):
        raise NotImplementedError

    def evaluate(self, problems, agents, generator, verifier, train_generator=None):
        return {}


@pytest.fixture
def registry():
    """The registry, restored after a test that registers a workflow of its own."""
    saved = dict(REGISTRY)
    yield REGISTRY
    REGISTRY.clear()
    REGISTRY.update(saved)


def test_a_workflow_without_play_and_credit_cannot_be_registered_or_built(registry):
    class NoRollout(Workflow[EchoConfig]):
        def evaluate(self, problems, agents, generator, verifier, train_generator=None):
            return {}

    with pytest.raises(TypeError, match="does not implement credit, play"):
        register_workflow("echo")(NoRollout)
    with pytest.raises(TypeError, match="abstract"):
        NoRollout()
    assert "echo" not in registry


def test_registration_checks_the_config_kind_and_clashes(registry):
    with pytest.raises(TypeError, match="must default to 'other'"):
        register_workflow("other")(Echo)
    assert register_workflow("echo")(Echo) is Echo and registry["echo"] == (EchoConfig, Echo)
    assert isinstance(build_workflow(EchoConfig(group_size=3)), Echo)

    class Impostor(Echo):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_workflow("echo")(Impostor)
    with pytest.raises(TypeError, match="Workflow subclass"):
        register_workflow("echo")(EchoConfig)


def test_the_workflow_owns_its_typed_config():
    assert Echo.config_type is EchoConfig
    cfg = EchoConfig(group_size=3)
    assert Echo(cfg).cfg is cfg and Echo.from_config(cfg).cfg is cfg
    assert Echo(group_size=5).cfg == EchoConfig(group_size=5)
    assert Echo(6, "there").cfg == EchoConfig(group_size=6, note="there")  # by position: field order
    for bad in ({"group_size": 1}, {"unknown": 1}):
        with pytest.raises(ValidationError):
            Echo(**bad)
    with pytest.raises(TypeError, match="at most 2"):
        Echo(3, "a", "b")
    with pytest.raises(TypeError, match="configured by EchoConfig, not GrpoConfig"):
        Echo(REGISTRY["grpo"][0]())
    wf = Echo()
    assert wf.state_dict() == {} and wf.load_state_dict({}) is None


def test_every_registered_kind_is_a_valid_workflow_section():
    base = {
        "policies": {"p": {"model": {"preset": "tiny-qwen3"}}},
        "agents": {name: {"policy": "p"} for name in ("alice", "bob")},
        "data": {"source": {"kind": "synthetic", "n_train": 2}},
    }
    assert list(REGISTRY)[0] == "grpo"  # the default kind
    assert {"grpo", "magrpo", "mars2", "at_grpo", "dr_mas", "sharp"} <= set(REGISTRY)
    cfg = config_from_dict(
        {**base, "workflow": {"kind": "magrpo", "agents": ["alice", "bob"], "group_size": 3}}
    )
    assert type(cfg.workflow) is REGISTRY["magrpo"][0] and cfg.workflow.group_size == 3


def gen(agent: str, policy: str = "p", version: int = 0) -> Generation:
    return Generation(
        "x",
        np.array([1, 2]),
        np.array([3]),
        np.zeros(1, np.float32),
        agent=agent,
        policy=policy,
        version=version,
    )


def test_rollout_arrays_samples_and_common_metrics():
    gens = [gen("b", "q", 2), gen("a"), gen("b", "q", 2), gen("a"), gen("a")]
    ids = [dict(problem="x", episode=i, node=0, parent=-1, depth=0, turn=0) for i in range(5)]
    rewards, adv, passed = [1.0, 0.5, 0.0, 1 / 3, 1.0], [1.0, 0.0, -1.0, -0.5, 0.5], [1, 0, 0, 0, 1]
    out = Rollout(gens, ids, rewards, adv, passed, extras={"team/x": 2.0})
    assert out.agent_names == ("a", "b") and out.agent_ids.tolist() == [1, 0, 1, 0, 0]
    assert out.policy_names == ("p", "q") and out.policy_ids.tolist() == [1, 0, 1, 0, 0]
    rows = out.rows
    assert (rows.agent[3], rows.policy[3], rows.version[3]) == ("a", "p", 0)
    assert (rows.reward[3], rows.advantage[3], rows.passed[3]) == (1 / 3, -0.5, 0.0)
    assert rows.version[0] == 2 and rows.to_json()["passed"][0] == 1.0
    m = out.metrics
    assert m["agent/a/reward"] == pytest.approx((0.5 + 1 / 3 + 1.0) / 3) and m["agent/b/reward"] == 0.5
    assert m["agent/a/pass_rate"] == pytest.approx(1 / 3) and m["agent/b/pass_rate"] == 0.5
    assert m["agent/a/adv_mean"] == 0.0 and m["agent/a/adv_std"] == pytest.approx(np.std([0.0, -0.5, 0.5]))
    assert m["agent/b/adv_std"] == 1.0 and m["team/x"] == 2.0
    factor = kernels.amplification_factor(jnp.asarray(rewards, jnp.float32), jnp.asarray([1, 0, 1, 0, 0]), 2)
    assert [m["agent/a/amplification"], m["agent/b/amplification"]] == pytest.approx(np.asarray(factor))
    assert set(agent_metrics(Rollout(gens[1:2], ids[1:2], [1.0], [0.0], [1]))) == {
        "agent/a/reward",
        "agent/a/pass_rate",
        "agent/a/adv_mean",
        "agent/a/adv_std",
    }  # one agent: no amplification


def test_rollout_refuses_ragged_arrays_and_extras_that_shadow_common_metrics():
    ids = [dict(problem="x", episode=0, node=0, parent=-1, depth=0, turn=0)]
    with pytest.raises(ValueError, match="one entry per completion"):
        Rollout([gen("a")], ids, [1.0, 0.0], [0.0], [1])
    clash = Rollout([gen("a")], ids, [1.0], [0.0], [1], extras={"agent/a/reward": 0.3})
    with pytest.raises(ValueError, match="agent/a/reward"):
        _ = clash.metrics


def test_eval_search_is_a_bool_option_and_the_cli_refuses_workflows_without_one(tmp_path, capsys):
    from marljax import cli

    searching = [c for c, _ in REGISTRY.values() if "eval_search" in c.model_fields]
    assert searching  # mars2
    for config_type in searching:
        assert config_type.model_fields["eval_search"].annotation is bool
    config = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
    code = cli.main(["eval", str(config), "--search", f"run_dir={tmp_path}"])
    assert code == 2 and "'grpo' has no test-time search" in capsys.readouterr().err


OUTSIDE_WORKFLOW = """
from typing import Literal

from pydantic import Field

from marljax import kernels
from marljax.workflows import BaseWorkflowConfig, Workflow, register_workflow
from marljax.workflows.episodes import Episodes


class BestOfConfig(BaseWorkflowConfig):
    kind: Literal["best_of_outside"] = "best_of_outside"
    group_size: int = Field(2, ge=2)


@register_workflow("best_of_outside")
class BestOf(Workflow[BestOfConfig]):
    def play(self, problems, agents, generator, verifier, seed):
        agent = next(iter(agents.values()))
        gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], self.cfg.group_size, seed)
        episodes = Episodes(len(problems))
        for i, group in enumerate(gens):
            scores = verifier.score([problems[i]] * len(group), [g.text for g in group])
            for k, (g, s) in enumerate(zip(group, scores)):
                episodes.add(g, problem=problems[i].id, episode=i, node=k, reward=s.reward, passed=s.passed)
        return episodes

    def credit(self, episodes):
        return kernels.grpo_advantages(
            episodes.array("reward"), episodes.array("episode"), num_groups=episodes.num_problems
        )

    def evaluate(self, problems, agents, generator, verifier, train_generator=None):
        return {}
"""


def test_a_workflow_module_outside_the_package_registers_and_runs_from_yaml(tmp_path, monkeypatch, registry):
    from marljax.rewards import Problem, Score
    from marljax.train.config import ConfigError, load_config
    from marljax.workflows import Agent, ScriptedGenerator

    (tmp_path / "outside_workflow.py").write_text(OUTSIDE_WORKFLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "outside_workflow", raising=False)
    config = tmp_path / "run.yaml"
    config.write_text(
        "policies: {p: {model: {preset: tiny-qwen3}}}\n"
        "agents: {solver: {policy: p}}\n"
        "data: {source: {kind: synthetic, n_train: 2}}\n"
        "workflow: {module: outside_workflow, kind: best_of_outside, group_size: 3}\n"
    )
    cfg = load_config(str(config))  # imports the module, which registers its kind
    assert type(cfg.workflow) is sys.modules["outside_workflow"].BestOfConfig and cfg.workflow.group_size == 3
    config.write_text(config.read_text().replace("module: outside_workflow", "module: no_such_module"))
    with pytest.raises(ConfigError, match="no_such_module"):
        load_config(str(config))
    wf = build_workflow(cfg.workflow)

    class Longest:
        def score(self, problems, texts):
            return [Score(reward=len(t) / 3, passed=len(t) == 3) for t in texts]

    problem = Problem("p0", "say", "math", "test:1", {})
    rollout = wf.rollout(
        [problem],
        {"solver": Agent("solver", "p")},
        ScriptedGenerator(lambda a, p, k, s: "x" * (k + 1)),
        Longest(),
        0,
    )
    assert [i["node"] for i in rollout.ids] == [0, 1, 2] and rollout.passed.tolist() == [0, 0, 1]
    assert rollout.advantages[0] < 0 < rollout.advantages[2]


def test_rollout_shapes_the_reward_column_once_between_play_and_credit():
    from marljax.workflows import Episodes

    seen = {}

    class Fixed(Echo):
        def play(self, problems, agents, generator, verifier, seed):
            episodes = Episodes(1, shaped=self.cfg.note == "shaped")
            for k, n in enumerate((1, 30, 60)):
                g = Generation("x" * n, np.array([1]), np.arange(n), np.zeros(n, np.float32), agent="a")
                episodes.add(g, problem="p", episode=0, node=k, reward=1.0, passed=True, group=0)
            return episodes

        def credit(self, episodes):
            seen["reward"] = episodes["reward"]
            return -episodes.array("reward")

    overlong = {"max_len": 40, "buffer_len": 20, "factor": 1.0}
    out = Fixed(overlong=overlong).rollout([], {}, None, None, 0)
    np.testing.assert_allclose(seen["reward"], [1.0, 0.5, 0.0])  # ramp from 20 to 40 tokens
    np.testing.assert_allclose(out.rewards, seen["reward"])
    np.testing.assert_allclose(out.advantages, -out.rewards)
    assert [i["node"] for i in out.ids] == [0, 1, 2] and out.passed.tolist() == [1, 1, 1]
    already = Fixed(overlong=overlong, note="shaped").rollout([], {}, None, None, 0)
    np.testing.assert_allclose(already.rewards, [1.0, 1.0, 1.0])  # play shaped them itself (joint actions)
    episodes = Fixed().play([], {}, None, None, 0)
    with pytest.raises(ValueError, match="differ"):  # every row has the same columns
        episodes.add(out.generations[0], problem="p", episode=0, node=3, reward=1.0, passed=True)
