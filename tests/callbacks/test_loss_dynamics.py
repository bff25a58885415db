"""LossDynamics: per-example values of the model at each epoch end, bounded capacity, index-addressed, resumable."""

from __future__ import annotations

import tempfile

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from callbacks.loss_dynamics import LossDynamics, example_values
from core.errors import ConfigError, DataFormatError
from datamodules._base import SuiteDataModule


class Indexed(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, with_index: bool = True) -> None:
        self.x, self.y, self.with_index = x, y, with_index

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return (self.x[i], self.y[i], i) if self.with_index else (self.x[i], self.y[i])


class ToyData(SuiteDataModule):
    def __init__(self, with_index: bool = True) -> None:
        super().__init__(batch_size=8, seed=0)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(37, 5, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()
        self.with_index = with_index

    def load_embedded(self):
        ds = Indexed(self.x, self.y, self.with_index)
        return {"train": ds, "val": ds, "test": ds}


class Toy(pl.LightningModule):
    """Any classification module: forward gives logits; nothing BaDLoss-specific."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, _):
        return F.cross_entropy(self(batch[0]), batch[1])

    def on_train_epoch_end(self):
        # Runs after callbacks' on_train_epoch_end: the weights the callback just scored.
        self.snapshots.append({k: v.detach().clone() for k, v in self.lin.state_dict().items()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def fit(cb: LossDynamics, epochs: int, data: ToyData | None = None, root=None) -> tuple[Toy, ToyData]:
    data = data or ToyData()
    model = Toy()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=str(root or tempfile.mkdtemp(prefix="loss_dynamics_")),
    )
    trainer.fit(model, datamodule=data)
    return model, data


@pytest.mark.parametrize("metric", ["loss", "prob"])
def test_records_every_example_each_epoch(metric):
    torch.manual_seed(0)
    cb = LossDynamics(metric=metric, capacity=10)
    model, data = fit(cb, 3)
    traj = cb.trajectories
    assert traj.shape == (37, 3) and cb.epochs == [0, 1, 2]
    assert bool(torch.isfinite(traj).all())
    assert len(model.snapshots) == 3
    for e, state in enumerate(model.snapshots):  # column e == the epoch-e model's values, row = example index
        logits = data.x @ state["weight"].T + state["bias"]
        torch.testing.assert_close(traj[:, e], example_values(logits, data.y, metric), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(traj[:, 0], traj[:, 2]), "the model changed between epochs"
    if metric == "prob":
        assert float(traj.min()) >= 0.0 and float(traj.max()) <= 1.0
    else:
        assert float(traj[:, -1].mean()) < float(traj[:, 0].mean()) + 1e-6  # it trained


def test_capacity_bounds_memory_and_every_n():
    cb = LossDynamics(capacity=2, every_n_epochs=1)
    fit(cb, 4)
    assert cb.trajectories.shape == (37, 2) and cb.epochs == [0, 1]
    assert cb._values.shape == (37, 2)
    cb = LossDynamics(capacity=5, every_n_epochs=2)
    fit(cb, 4)
    assert cb.epochs == [1, 3]


def test_disabled_and_state_roundtrip():
    cb = LossDynamics(enabled=False)
    fit(cb, 2)
    assert cb.trajectories is None
    cb = LossDynamics(capacity=4, dtype="float16")
    fit(cb, 2)
    other = LossDynamics(capacity=4, dtype="float16")
    other.load_state_dict(cb.state_dict())
    assert torch.equal(other.trajectories, cb.trajectories) and other.epochs == [0, 1]
    assert other.trajectories.dtype == torch.float16


class DictData(ToyData):
    def load_embedded(self):
        ds = [{"x": x, "y": y} for x, y in zip(self.x, self.y)]
        return {"train": ds, "val": ds, "test": ds}


class UnindexedDynamics(ToyData):
    """Names a dynamics loader, but its batches carry no index."""

    def dynamics_dataloader(self):
        return self.loader("train", shuffle=False)


def test_a_train_split_without_index_is_scored_by_row_and_the_matrix_is_written(tmp_path):
    cb = LossDynamics(capacity=3)
    model, data = fit(cb, 2, ToyData(with_index=False), root=tmp_path)
    assert cb.trajectories.shape == (37, 2) and bool(torch.isfinite(cb.trajectories).all())
    logits = data.x @ model.snapshots[-1]["weight"].T + model.snapshots[-1]["bias"]
    torch.testing.assert_close(cb.trajectories[:, -1], example_values(logits, data.y, "loss"), rtol=1e-6, atol=1e-6)
    saved = torch.load(tmp_path / "loss_dynamics.pt", weights_only=True)
    assert torch.equal(saved["values"], cb.trajectories) and saved["epochs"].tolist() == [0, 1]
    fit(LossDynamics(save=False), 1, root=tmp_path / "off")
    assert not (tmp_path / "off" / "loss_dynamics.pt").exists()


def test_errors():
    with pytest.raises(
        ConfigError,
        match=r"^callbacks.loss_dynamics: datamodule UnindexedDynamics dynamics batches "
        r"are \(x, y\), needs \(x, y, index\)",
    ):
        fit(LossDynamics(), 1, UnindexedDynamics(with_index=False))
    with pytest.raises(ConfigError, match=r"training items are dicts with keys \['x', 'y'\], needs \(x, y\)"):
        fit(LossDynamics(), 1, DictData())
    data = UnindexedDynamics(with_index=False)  # the check is at setup; recording without an index fails on its own
    data.setup()
    with pytest.raises(DataFormatError, match="no index"):
        LossDynamics().record(type("T", (), {"datamodule": data, "world_size": 1})(), Toy())
    with pytest.raises(ConfigError, match="metric='acc'"):
        LossDynamics(metric="acc")
    with pytest.raises(ConfigError, match="capacity=0"):
        LossDynamics(capacity=0)


class OddDynamicsData(ToyData):
    """38 training rows (global batch 8 splits evenly over 2 ranks), losses recorded on the first 37: under 2-process
    DDP the dynamics loader pads 37 to 38, so one example is scored on both ranks and scattered twice."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(38, 5, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()

    def load_embedded(self):
        out = super().load_embedded()
        return {**out, "dynamics": Indexed(self.x[:37], self.y[:37])}

    def dynamics_dataloader(self):
        return self.loader("dynamics", shuffle=False)


class SaveTrajectories(pl.Callback):
    """Each rank writes the matrix its own LossDynamics holds (forked DDP children do not return callbacks)."""

    def __init__(self, out_dir) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        rec = next(cb for cb in trainer.callbacks if isinstance(cb, LossDynamics))
        torch.save({"traj": rec.trajectories, "epochs": rec.epochs}, self.out_dir / f"rank{trainer.global_rank}.pt")


def test_ddp_two_processes_record_the_single_process_matrix(tmp_path):
    # 2-process gloo DDP on CPU: each rank scores its shard of the dynamics set, the (index, value) pairs are
    # all-gathered and scattered by example index. Same global batch (8 = 2 x 4, the suite's loaders deal the same
    # 8 examples to the ranks) and the same initial weights, so training matches and so must the recorded matrix.
    def run(strategy: str, devices: int, out) -> None:
        out.mkdir()
        torch.manual_seed(0)
        model = Toy()
        trainer = pl.Trainer(
            max_epochs=3,
            accelerator="cpu",
            devices=devices,
            strategy=strategy,
            use_distributed_sampler=False,
            default_root_dir=str(out),
            callbacks=[LossDynamics(capacity=5), SaveTrajectories(out)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(model, datamodule=OddDynamicsData())

    run("auto", 1, tmp_path / "single")
    run("ddp_fork", 2, tmp_path / "ddp")  # fork: no re-import in the children, keeps it fast
    single = torch.load(tmp_path / "single" / "rank0.pt")
    ranks = [torch.load(tmp_path / "ddp" / f"rank{r}.pt") for r in (0, 1)]
    assert single["traj"].shape == (37, 3) and single["epochs"] == [0, 1, 2]
    assert not torch.allclose(single["traj"][:, 0], single["traj"][:, 2]), "it trained"
    for r, got in enumerate(ranks):
        assert got["epochs"] == [0, 1, 2], r
        assert bool(torch.isfinite(got["traj"]).all()), f"rank {r} has unfilled rows"
        # float32 all-reduce sums in another order: equal to rounding, not bitwise.
        torch.testing.assert_close(got["traj"], single["traj"], rtol=1e-5, atol=1e-6)
    assert torch.equal(ranks[0]["traj"], ranks[1]["traj"]), "every rank holds the same full matrix"
