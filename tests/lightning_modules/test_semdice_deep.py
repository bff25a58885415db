"""Deep SEMDICE: generated gymnasium datasets, the env-not-installed error, the batch dual, losses and coverage."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataFormatError
from datamodules.gym_offline import ARRAYS, GymOfflineDataModule, generate, make_env
from lightning_modules.semdice import DeepSemdiceLitModule
from ops.semdice import deep as ops


def test_unknown_env_names_the_package():
    with pytest.raises(ConfigError, match=r"PointMaze_Nowhere-v9.*pip install gymnasium-robotics==1.4.2"):
        make_env("PointMaze_Nowhere-v9")
    with pytest.raises(ConfigError, match=r"Nope-v0.*pip install 'gymnasium\[mujoco\]==1.4.0'"):
        make_env("Nope-v0")


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium_robotics", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"^env_id='PointMaze_UMaze-v3' needs gymnasium-robotics: pip install"):
        make_env("PointMaze_UMaze-v3")
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ConfigError, match=r"^env_id needs gymnasium: pip install"):
        make_env("HalfCheetah-v5")


def test_generate_and_read_back(tmp_path):
    arrays = generate("PointMaze_UMaze-v3", "sticky", 300, 100, seed=0, repeat=10)
    assert arrays["obs"].shape == (300, 4) and arrays["action"].shape == (300, 2)
    # transitions chain within an episode, sticky actions are held for `repeat` steps
    np.testing.assert_array_equal(arrays["next_obs"][:99], arrays["obs"][1:100])
    np.testing.assert_array_equal(arrays["action"][0], arrays["action"][9])
    assert not np.array_equal(arrays["action"][9], arrays["action"][10])
    again = generate("PointMaze_UMaze-v3", "sticky", 300, 100, seed=0, repeat=10)
    np.testing.assert_array_equal(arrays["obs"], again["obs"])
    np.savez(tmp_path / "d.npz", **arrays)
    dm = GymOfflineDataModule(source="real", data_dir=str(tmp_path), filename="d.npz", batch_size=32)
    dm.setup("fit")
    assert (dm.obs_dim, dm.act_dim) == (4, 2) and len(dm.datasets["train"]) + len(dm.datasets["val"]) == 300
    np.savez(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if k != "reward"})
    with pytest.raises(DataFormatError, match=r"missing array\(s\) \['reward'\]"):
        GymOfflineDataModule(source="real", data_dir=str(tmp_path), filename="bad.npz").setup("fit")
    with pytest.raises(ConfigError, match="data.policy='greedy'"):
        GymOfflineDataModule(policy="greedy")


def test_mujoco_task_generates_and_trains_a_step():
    arrays = generate("HalfCheetah-v5", "eps_sticky", 64, 32, seed=1)
    assert arrays["obs"].shape == (64, 17) and arrays["action"].shape == (64, 6)
    m = DeepSemdiceLitModule(obs_dim=17, act_dim=6, hidden=16)
    batch = [torch.from_numpy(arrays[k]) for k in ARRAYS]
    assert all(torch.isfinite(v) for v in m.losses(batch).values())


def test_batch_dual_matches_formula():
    g = torch.Generator().manual_seed(0)
    nu, nu2, mu, logp = (torch.randn(64, dtype=torch.float64, generator=g) for _ in range(4))
    nd = (torch.rand(64, generator=g) > 0.1).double()
    got = ops.semdice_deep_dual(nu, nu2, mu, logp, nd, 0.99, 0.5)
    e = mu + 0.99 * nd * nu2 - nu
    y = e / 0.5
    conj = torch.where(y < 0, torch.exp(y) - 1, 0.5 * y**2 + y)
    want = (nu - 0.99 * nd * nu2).mean() + 0.5 * conj.mean() + torch.log(torch.exp(-mu - logp).mean())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    y = torch.tensor([-1.5, 0.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(ops.log_soft_chisq_f_prime_inv(y), torch.log(ops.soft_chisq_f_prime_inv(y)))


@pytest.mark.parametrize("method", ["semdice", "apt"])
def test_losses_reach_their_networks(method):
    torch.manual_seed(0)
    m = DeepSemdiceLitModule(obs_dim=4, act_dim=2, method=method, hidden=16)
    batch = [torch.randn(32, 4), torch.rand(32, 2) * 2 - 1, torch.randn(32, 4), torch.zeros(32), torch.zeros(32)]
    losses = m.losses(batch)
    assert set(losses) == ({"dual", "critic", "actor"} if method == "semdice" else {"critic", "actor"})
    assert all(torch.isfinite(v) for v in losses.values())
    owners = {"dual": [m.nu, m.mu], "critic": [m.critic], "actor": [m.actor]}
    for name, loss in losses.items():
        m.zero_grad()
        loss.backward(retain_graph=True)
        for net in owners[name]:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters()), (name, net)
        if name == "critic":  # the critic's target is detached: no gradient into nu / mu
            assert all(p.grad is None or p.grad.abs().sum() == 0 for p in m.nu.parameters())


def test_coverage_counts_cells():
    m = DeepSemdiceLitModule(obs_dim=4, act_dim=2, hidden=8, cell=1.0)
    env = make_env("PointMaze_UMaze-v3", max_episode_steps=50)
    cov = m.coverage(env, episodes=1, steps=50, seed=0)
    assert 1 <= cov["cells"] <= 50 and 0 <= cov["cell_entropy"] <= np.log(cov["cells"]) + 1e-9
    # the data's behaviour policy rolled out instead of the actor: the same sticky actions as the generator draws
    dm = GymOfflineDataModule(policy="sticky", repeat=5)
    pol = dm.behaviour_policy(env, seed=3)
    acts = [pol.act(t).copy() for t in range(10)]
    np.testing.assert_array_equal(acts[0], acts[4])
    assert not np.array_equal(acts[4], acts[5])
    cov_b = m.coverage(env, episodes=1, steps=50, seed=0, behaviour=dm.behaviour_policy(env, seed=3))
    assert 1 <= cov_b["cells"] <= 50 and cov_b != cov
    env.close()
    with pytest.raises(ConfigError, match="model.eval_policy='greedy'"):
        DeepSemdiceLitModule(eval_policy="greedy")
    with pytest.raises(ConfigError, match="model.method='rnd'"):
        DeepSemdiceLitModule(method="rnd")
    with pytest.raises(ConfigError, match="model.alpha=0"):
        DeepSemdiceLitModule(alpha=0)
    assert len(ARRAYS) == 5


def test_finetune_loads_pretrained_actor(tmp_path):
    from core.errors import CheckpointError
    from lightning_modules.semdice import DdpgFinetuneLitModule

    pre = DeepSemdiceLitModule(obs_dim=4, act_dim=2, hidden=16)
    torch.save({"state_dict": pre.state_dict()}, tmp_path / "pre.ckpt")
    ft = DdpgFinetuneLitModule(init_ckpt=str(tmp_path / "pre.ckpt"), hidden=16, buffer_size=10)
    ft._build(4, 2)
    for p, q in zip(pre.actor.parameters(), ft.actor.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    scratch = DdpgFinetuneLitModule(hidden=16, buffer_size=10)
    scratch._build(4, 2)
    assert any((p - q).abs().max() > 0 for p, q in zip(pre.actor.parameters(), scratch.actor.parameters()))
    with pytest.raises(CheckpointError, match="actor does not fit"):
        DdpgFinetuneLitModule(init_ckpt=str(tmp_path / "pre.ckpt"), hidden=32, buffer_size=10)._build(4, 2)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        DdpgFinetuneLitModule(init_ckpt=str(tmp_path / "missing.ckpt"))


def test_finetune_experiment_fixes_the_maze_task(tmp_path):
    from tests.conftest import compose_train

    cfg = compose_train(["experiment=semdice_finetune"], tmp_path)
    assert cfg.model._target_.endswith("DdpgFinetuneLitModule") and cfg.model.init_ckpt is None
    dm = GymOfflineDataModule.__module__  # same file holds the online datamodule
    assert cfg.data._target_ == f"{dm}.GymOnlineDataModule" and list(cfg.data.goal_cell) == [1, 1]


def test_finetune_picks_the_pretraining_run_of_its_seed(tmp_path):
    """``init_run`` = a claim entry's multirun folder: the run whose saved config has the fine-tuning seed."""
    from core.errors import CheckpointError
    from lightning_modules.semdice import DdpgFinetuneLitModule
    from lightning_modules.semdice.finetune import pretrained_checkpoint

    sweep = tmp_path / "semdice_deep" / "semdice"
    actors = {}
    for job, seed in enumerate([2, 0, 1]):  # job folders need not be in seed order
        run = sweep / str(job)
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.yaml").write_text(f"seed: {seed}\n")
        torch.manual_seed(seed)
        pre = DeepSemdiceLitModule(obs_dim=4, act_dim=2, hidden=8)
        torch.save({"state_dict": pre.state_dict()}, run / "checkpoints" / "last.ckpt")
        actors[seed] = pre.actor
    assert pretrained_checkpoint(str(sweep), 1) == str(sweep / "2" / "checkpoints" / "last.ckpt")
    assert pretrained_checkpoint(str(sweep / "1"), 0).endswith("1/checkpoints/last.ckpt")  # one run folder
    ft = DdpgFinetuneLitModule(init_run=str(sweep), init_seed=0, hidden=8, buffer_size=10)
    ft._build(4, 2)
    for p, q in zip(actors[0].parameters(), ft.actor.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"no pre-training run of seed 5 \(seeds there: \[0, 1, 2\]\)"):
        DdpgFinetuneLitModule(init_run=str(sweep), init_seed=5)
    with pytest.raises(CheckpointError, match="no such run folder.*make claim METHOD=semdice_deep"):
        DdpgFinetuneLitModule(init_run=str(tmp_path / "absent"))
    (sweep / "0" / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(CheckpointError, match="run 0 of seed 2 has no checkpoints/last.ckpt"):
        DdpgFinetuneLitModule(init_run=str(sweep), init_seed=2)
    with pytest.raises(ConfigError, match="exclusive"):
        DdpgFinetuneLitModule(init_run=str(sweep), init_ckpt="x.ckpt")


def _apt_module(**kw):
    from lightning_modules.semdice import DdpgFinetuneLitModule

    m = DdpgFinetuneLitModule(hidden=16, buffer_size=10, batch=32, reward="apt", double_q=True, knn_k=4, **kw)
    m._build(4, 2)
    return m


def test_online_apt_rewards_novelty_not_the_task_and_bootstraps_on_the_twin_minimum():
    """reward=apt: the TD target is APT's particle reward of the next states (the env's reward ignored) plus the
    discounted minimum of the two target critics; each critic is regressed to it; the actor maximises the minimum."""
    g = torch.Generator().manual_seed(0)
    s, s2 = torch.randn(32, 4, dtype=torch.float64, generator=g), torch.randn(32, 4, dtype=torch.float64, generator=g)
    a = torch.rand(32, 2, dtype=torch.float64, generator=g) * 2 - 1
    d = (torch.rand(32, generator=g) < 0.2).double()
    m = _apt_module()
    with torch.no_grad():  # centre the second target critic on the first, so that each is the minimum somewhere
        probe = torch.cat([s2, m.actor_target(s2)], -1)
        m.critic2_target[-1].bias += (m.critic_target(probe) - m.critic2_target(probe)).mean()
    torch.manual_seed(5)
    loss0, r0 = m.critic_loss(s, a, torch.zeros(32, dtype=torch.float64), s2, d)
    m.rms_state.copy_(torch.tensor([0.0, 1e-4], dtype=torch.float64))
    torch.manual_seed(5)
    loss1, r1 = m.critic_loss(s, a, torch.full((32,), 1e6, dtype=torch.float64), s2, d)
    torch.testing.assert_close(loss0, loss1, rtol=0, atol=0)  # the task reward never enters
    torch.manual_seed(5)
    eps = (torch.randn_like(a) * m.noise).clamp(-m.noise_clip, m.noise_clip)
    a2 = (m.actor_target(s2) + eps).clamp(-1, 1)
    with torch.no_grad():
        x2 = torch.cat([s2, a2], -1)
        q1_next, q2_next = m.critic_target(x2).squeeze(-1), m.critic2_target(x2).squeeze(-1)
        assert (q1_next < q2_next).any() and (q2_next < q1_next).any()  # the twins differ: the minimum matters
        q_next = torch.minimum(q1_next, q2_next)
        r = ops.apt_particle_reward(s2, 4, 1.0, ops.RunningMean())
        target = r + m.gamma * (1 - d) * q_next
        x = torch.cat([s, a], -1)
        want = ((m.critic(x).squeeze(-1) - target) ** 2).mean() + ((m.critic2(x).squeeze(-1) - target) ** 2).mean()
    torch.testing.assert_close(r0, r, rtol=0, atol=1e-14)
    torch.testing.assert_close(loss0, want, rtol=0, atol=1e-12)
    assert float(m.rms_state[1]) == pytest.approx(32 * 4 + 1e-4)  # the running mean saw every distance once
    q1, q2 = m.q(m.critic, s, a), m.q(m.critic2, s, a)
    torch.testing.assert_close(m.q_min(s, a), torch.minimum(q1, q2), rtol=0, atol=0)
    task = _apt_module()
    task.reward = "task"
    torch.manual_seed(5)
    lt0, _ = task.critic_loss(s, a, torch.zeros(32, dtype=torch.float64), s2, d)
    torch.manual_seed(5)
    lt1, _ = task.critic_loss(s, a, torch.ones(32, dtype=torch.float64), s2, d)
    assert float((lt0 - lt1).abs()) > 1e-3  # with reward=task the env's reward is the target's
    from lightning_modules.semdice import DdpgFinetuneLitModule

    with pytest.raises(ConfigError, match="model.reward='rnd'"):
        DdpgFinetuneLitModule(reward="rnd")
    with pytest.raises(ConfigError, match="model.knn_k=12 must be smaller than model.batch=8"):
        DdpgFinetuneLitModule(reward="apt", batch=8)
    with pytest.raises(ConfigError, match="model.eval_metric='auc'"):
        DdpgFinetuneLitModule(eval_metric="auc")


def test_the_claims_online_apt_entry_runs_and_semdice_learns_from_its_replay(tmp_path, capsys):
    """The deep claim's ``apt_online`` and ``semdice_on_apt`` entries, run as ``suite.claim`` runs them (the same
    multirun command and folders; tiny budgets appended): APT learns from its own replay with the particle reward,
    logs the coverage curve against environment steps, records its step-0 coverage for the weak-baseline rule,
    leaves an actor the downstream check can load and writes its replay to ``<run>/replay.npz``; SEMDICE of the same
    seed reads that file (its data's coverage is the buffer's) and is scored by the same roll-outs."""
    import json

    from lightning_modules.semdice import DdpgFinetuneLitModule
    from suite.claim import entry_command, load_spec
    from tests.conftest import run_entry

    spec = load_spec("semdice_deep")
    entries = {e["name"]: e for e in spec["runs"]}
    short = ["model.eval_episodes=1", "model.eval_steps=40", "data.episode_steps=40", "trainer.max_epochs=2"]
    online = ["data.steps_per_epoch=30", "model.warmup=16", "model.batch=24", *short, f"paths.log_dir={tmp_path}"]
    out = tmp_path / "claim"

    def run(name: str, extra: list[str]) -> dict:
        cmd = entry_command("semdice_deep", entries[name], spec, out, extra, seed=1)
        assert cmd[2:4] == ["train", "-m"]
        assert run_entry("train", cmd[3:]) == 0, capsys.readouterr().err[-2000:]
        return json.loads((out / name / "1" / "metrics.json").read_text())  # seed 1: the second subfolder

    metrics = run("apt_online", online)
    run_dir = out / "apt_online" / "1"
    assert {"test/cell_entropy", "test/cells", "val/cell_entropy@start"} <= set(metrics), sorted(metrics)
    assert "test/return" not in metrics
    curve = (run_dir / "csv" / "metrics.csv").read_text()
    assert "train/intr_reward" in curve and "val/env_steps" in curve
    with np.load(run_dir / "replay.npz") as f:
        assert f["obs"].shape == (2 * 30 * 2, 4) and f["action"].shape == (120, 2)  # epochs x steps x env_steps
    ft = DdpgFinetuneLitModule(init_ckpt=str(run_dir / "checkpoints" / "last.ckpt"), buffer_size=10)
    ft._build(4, 2)  # the downstream check loads this actor like a SEMDICE one
    assert (
        "data.path=${hydra:sweep.dir}/../apt_online/${hydra:sweep.subdir}/replay.npz"
        in entries["semdice_on_apt"]["overrides"]
    )
    learnt = run(
        "semdice_on_apt", [*short, "data.batch_size=32", "data.val_fraction=0.25", f"paths.log_dir={tmp_path}"]
    )
    assert learnt["test/data_cells"] == metrics["test/data_cells"] > 1  # the same transitions
    assert learnt["test/data_cell_entropy"] == pytest.approx(metrics["test/data_cell_entropy"], abs=1e-6)
    assert {"test/cell_entropy", "test/cells"} <= set(learnt) and learnt["test/cells"] >= 1
    (run_dir / "replay.npz").unlink()
    cmd = entry_command("semdice_deep", entries["semdice_on_apt"], spec, out, [*short, f"paths.log_dir={tmp_path}"], 1)
    assert run_entry("train", cmd[3:]) != 0
    err = capsys.readouterr().err
    assert "apt_online/1/replay.npz: no such file" in err and "Traceback" not in err, err[-2000:]


class _CountingEnv:
    """A stand-in environment whose states count its steps (obs ``[t, 2t, 0, 1]``), recording every transition it
    produced, so that the replay buffer can be compared with what was collected."""

    def __init__(self) -> None:
        self.t, self.seen = 0, []

    def state(self) -> np.ndarray:
        return np.array([self.t, 2 * self.t, 0, 1], dtype=np.float32)

    def step(self, action):
        s = self.state()
        self.t += 1
        self.seen.append((s, np.asarray(action, dtype=np.float32), self.state(), float(self.t), self.t % 7 == 0))
        return self.state(), float(self.t), self.t % 7 == 0, False, {}


def _collecting_module(buffer_size: int):
    from lightning_modules.semdice import DdpgFinetuneLitModule

    m = DdpgFinetuneLitModule(hidden=8, buffer_size=buffer_size, batch=4, warmup=3, save_replay=True)
    m._build(4, 2)
    m.env, m._rng, m._ret, m.log = _CountingEnv(), np.random.default_rng(0), 0.0, lambda *a, **k: None
    m._obs = m.env.state().astype(np.float64)
    m._reset = lambda env, seed=None: env.state().astype(np.float64)  # episodes chain on: one stream of states
    return m


@pytest.mark.parametrize("collected", [9, 23])  # within the buffer, and past it (the oldest overwritten)
def test_replay_file_holds_the_collected_transitions_oldest_first(tmp_path, collected):
    from types import SimpleNamespace

    from lightning_modules.semdice.finetune import REPLAY_FILE

    m = _collecting_module(buffer_size=16)
    for _ in range(collected):
        m._collect()
    kept = m.env.seen[-16:]
    m._trainer = SimpleNamespace(is_global_zero=True, default_root_dir=str(tmp_path))
    m.on_fit_end()
    with np.load(tmp_path / REPLAY_FILE) as f:
        got = {k: f[k] for k in f.files}
    assert (
        sorted(got) == sorted(ARRAYS) and got["obs"].shape == (len(kept), 4) and got["action"].shape == (len(kept), 2)
    )
    assert got["reward"].shape == got["terminated"].shape == (len(kept),)
    assert all(v.dtype == np.float32 for v in got.values())
    for i in (0, -1):  # first and last transitions, field by field
        s, a, s2, r, done = kept[i]
        np.testing.assert_array_equal(got["obs"][i], s)
        np.testing.assert_allclose(got["action"][i], a, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(got["next_obs"][i], s2)
        assert (got["reward"][i], got["terminated"][i]) == (r, float(done))
    np.testing.assert_array_equal(got["obs"][:, 0], [s[0] for s, *_ in kept])  # every row, in collection order
    assert got["terminated"].sum() == sum(d for *_, d in kept) > 0
    dm = GymOfflineDataModule(path=str(tmp_path / REPLAY_FILE), batch_size=4)  # read back as offline data
    dm.setup("fit")
    assert len(dm.datasets["train"]) + len(dm.datasets["val"]) == len(kept) and (dm.obs_dim, dm.act_dim) == (4, 2)
    np.testing.assert_array_equal(dm.states, got["next_obs"])
    off = SimpleNamespace(is_global_zero=True, default_root_dir=str(tmp_path / "off"))
    m.save_replay, m._trainer = False, off
    m.on_fit_end()
    assert not (tmp_path / "off").exists()  # save_replay=false writes nothing


def test_the_replay_and_its_counters_survive_a_checkpoint():
    """A resumed online run keeps the transitions it collected before the checkpoint (else its replay.npz, which
    semdice_on_apt learns from, would hold only those after the resume)."""
    m = _collecting_module(buffer_size=16)
    for _ in range(23):
        m._collect()
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    ckpt = torch.load(_roundtrip(ckpt), weights_only=True)  # as the runner loads checkpoints
    fresh = _collecting_module(buffer_size=16)
    fresh.on_load_checkpoint(ckpt)
    assert (fresh.size, fresh.env_step) == (m.size, m.env_step) == (23, 23)
    for k, v in m.replay_arrays().items():
        np.testing.assert_array_equal(fresh.replay_arrays()[k], v)


def _roundtrip(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_data_path_errors_are_one_line(tmp_path):
    from core.errors import MissingDataError

    with pytest.raises(MissingDataError, match=r"^data.path=.*nope.npz: no such file \(an online run with"):
        GymOfflineDataModule(path=str(tmp_path / "nope.npz")).setup("fit")
    arrays = generate("PointMaze_UMaze-v3", "sticky", 50, 25, seed=0)
    np.savez(tmp_path / "ok.npz", **arrays)
    raw = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])  # a truncated write
    (tmp_path / "junk.npz").write_bytes(b"not an npz at all" * 10)
    for name in ("cut.npz", "junk.npz"):
        with pytest.raises(DataFormatError, match=rf"^\S*{name}: not a readable .npz \(\w+: .*\)$"):
            GymOfflineDataModule(path=str(tmp_path / name)).setup("fit")
    np.savez(tmp_path / "flat.npz", **{**arrays, "obs": arrays["obs"][:, 0]})
    with pytest.raises(DataFormatError, match=r"flat.npz: needs >= 2 transitions with obs \[N, D\]"):
        GymOfflineDataModule(path=str(tmp_path / "flat.npz")).setup("fit")
    dm = GymOfflineDataModule(path=str(tmp_path / "ok.npz"), source="real")  # path wins over source/filename
    dm.setup("fit")
    assert dm.states.shape == (50, 4)
    with pytest.raises(ConfigError, match=r"data.path=.*no behaviour policy.*eval_policy=behaviour"):
        dm.behaviour_policy(make_env("PointMaze_UMaze-v3"), seed=0)
