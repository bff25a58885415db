"""`make compare` over a sweep: the configurations on shared axes (one panel per metric, one colour per override
value, seeds thin around a bold mean), a second override split out only when asked, titles whole, axes plain; and
a claim page's curves drawn from its data file alone, at most 12 panels of the metrics its claims read."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

import suite.compare as compare_mod
from suite.compare import main as compare_main
from tests.conftest import ROOT

LR = "model.optimizer.lr"


def fake_run(folder: Path, overrides: list[str], seed: int, level: float) -> Path:
    """A finished run folder as `make train` leaves it: `.hydra/overrides.yaml`, `csv/metrics.csv`, `metrics.json`.
    Its validation loss sits near 771.9 and moves by 1e-4, which matplotlib's default axis would draw as an
    offset (`+7.719e2`)."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump(["experiment=leaderbot", *overrides, f"seed={seed}"])
    )
    (folder / "csv").mkdir()
    with (folder / "csv" / "metrics.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "epoch", "train/loss", "val/loss", "val/acc"])
        for step in range(0, 100, 10):
            w.writerow([step, step // 10, level + 1.0 / (1 + step), "", ""])
            w.writerow([step, step // 10, "", 771.9 + level * 1e-4 - step * 1e-6 + seed * 1e-5, 0.5 + level / 10])
    (folder / "metrics.json").write_text(json.dumps({"test/loss": 771.9 + level * 1e-4, "test/acc": 0.5 + level}))
    return folder


def sweep(root: Path, lrs: tuple[str, ...], extra: tuple[tuple[str, ...], ...] = ((),)) -> Path:
    """A multirun folder of one run per (lr, extra override, seed), numbered as Hydra numbers its jobs."""
    n = 0
    for i, lr in enumerate(lrs):
        for j, more in enumerate(extra):
            for seed in (0, 1):
                fake_run(root / str(n), [f"{LR}={lr}", *more], seed, level=i + 2 * j)
                n += 1
    return root


@pytest.fixture
def drawn(monkeypatch):
    """The figures :func:`suite.compare.curves_figure` returns while a command runs (the ones written as PNGs)."""
    figures = []
    real = compare_mod.curves_figure

    def spy(*args, **kwargs):
        figures.append(real(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(compare_mod, "curves_figure", spy)
    return figures


def panels(fig) -> list:
    """The drawn panels of ``fig`` (given an Agg canvas again: writing the PNG closed it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return [ax for ax in fig.axes if ax.axison]


def legend(fig) -> list[str]:
    (box,) = fig.legends
    return [" ".join(t.get_text().split()) for t in box.get_texts()]  # a long label is wrapped at its spaces


def test_a_two_value_lr_sweep_shares_its_axes(tmp_path, drawn, capsys):
    runs = sweep(tmp_path / "multirun", ("0.001", "0.0001"))
    compare_main(["--runs", str(runs), "--metrics", "test/loss,test/acc", "--out", str(tmp_path / "cmp")])
    assert (tmp_path / "cmp" / "curves.png").stat().st_size > 1000
    (fig,) = drawn
    axes = panels(fig)
    # one panel per metric (train/loss, then the curve of each table metric), both lr values on each
    assert [ax.get_title() for ax in axes] == ["train/loss", "val/loss", "val/acc"]
    assert legend(fig) == [f"{LR}=0.001", f"{LR}=0.0001"]
    for ax in axes:
        bold = [ln for ln in ax.get_lines() if ln.get_linewidth() == 2.0]
        thin = [ln for ln in ax.get_lines() if ln.get_linewidth() < 1.0]
        assert [ln.get_label() for ln in bold] == [f"{LR}=0.001", f"{LR}=0.0001"], ax.get_title()
        assert len(thin) == 4 and {ln.get_color() for ln in thin} == {ln.get_color() for ln in bold}  # seeds
        assert len({ln.get_color() for ln in bold}) == 2
        # plain axes: no offset or multiplier text (the validation loss would otherwise read `+7.719e2`)
        assert ax.yaxis.get_offset_text().get_text() == "" and ax.xaxis.get_offset_text().get_text() == ""
    val_loss = axes[1]
    labels = [t.get_text() for t in val_loss.get_yticklabels() if t.get_text()]
    assert labels and all(771.8 < float(lab) < 772.0 for lab in labels), labels  # each tick reads its own value


def test_split_by_gives_one_row_per_value_only_when_asked(tmp_path, drawn):
    batch = (("data.batch_size=16",), ("data.batch_size=32",))
    runs = sweep(tmp_path / "multirun", ("0.001", "0.0001"), batch)
    compare_main(["--runs", str(runs), "--metrics", "test/loss", "--out", str(tmp_path / "one")])
    compare_main(["--runs", str(runs), "--metrics", "test/loss", "--out", str(tmp_path / "two"), "--split-by", LR])
    together, split = drawn
    # not asked: every configuration on the same two panels, one colour each
    assert [ax.get_title() for ax in panels(together)] == ["train/loss", "val/loss"]
    assert legend(together) == [f"{LR}={lr} data.batch_size={b}" for lr in ("0.001", "0.0001") for b in (16, 32)]
    # asked: a row per lr value, coloured by the batch size (the same colour in both rows)
    titles = [ax.get_title() for ax in panels(split)]
    assert titles == [f"{LR}={lr}: {k}" for lr in ("0.001", "0.0001") for k in ("train/loss", "val/loss")]
    assert legend(split) == ["data.batch_size=16", "data.batch_size=32"]
    colours = [[ln.get_color() for ln in ax.get_lines() if ln.get_linewidth() == 2.0] for ax in panels(split)]
    assert len({tuple(c) for c in colours}) == 1 and len(colours[0]) == 2


def test_split_by_an_override_that_does_not_differ_is_one_line(tmp_path, capsys):
    runs = sweep(tmp_path / "multirun", ("0.001", "0.0001"))
    with pytest.raises(SystemExit) as exit_:
        compare_main(["--runs", str(runs), "--out", str(tmp_path / "cmp"), "--split-by", "data.batch_size"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0] == f"error: --split-by data.batch_size: not an override that differs between these runs ({LR})"


def test_titles_are_wrapped_whole_and_apart(tmp_path, drawn):
    key = "model.optimizer.param_groups.weight_decay"  # with its value, a word longer than a title line
    runs = tmp_path / "multirun"
    for i, value in enumerate(("0.0", "0.01")):
        for seed in (0, 1):
            fake_run(runs / f"{i}{seed}", [f"{key}={value}", "data.batch_size=16"], seed, level=i)
    fake_run(runs / "20", [f"{key}=0.0", "data.batch_size=32"], 0, level=2)
    compare_main(["--runs", str(runs), "--metrics", "test/loss", "--out", str(tmp_path / "cmp"), "--split-by", key])
    (fig,) = drawn
    axes = panels(fig)
    expected = [f"{key}={v}: {k}" for v in ("0.0", "0.01") for k in ("train/loss", "val/loss")]
    assert [ax.get_title().splitlines() for ax in axes] == [t.split() for t in expected]  # whole words, wrapped
    renderer = fig.canvas.get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in axes]
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1 :]), expected[i]  # no title runs into another


def test_claim_page_curves_come_from_the_data_file_with_at_most_12_panels(tmp_path, drawn):
    """leaderbot's data file: 13 entries in 5 settings, 16 curves each; the page draws the metrics its claims read."""
    from suite import results_data
    from suite.claim import write_page
    from suite.claims import ClaimSpec

    data = results_data.load(ROOT / "docs" / "results" / "data" / "leaderbot.json")
    records = results_data.records_from(data, tmp_path / "files")
    spec = ClaimSpec.from_dict("leaderbot", yaml.safe_load((ROOT / "conf" / "claim" / "leaderbot.yaml").read_text()))
    page = write_page("leaderbot", spec, records, results_data.status_from(data), tmp_path, [], tmp_path / "p.md")
    assert (tmp_path / "leaderbot_curves.png").stat().st_size > 1000
    assert "leaderbot_curves.png" in page.read_text()
    fig = drawn[-1]
    axes = panels(fig)
    assert 1 <= len(axes) <= 12
    read = {t for c in spec.claims for m in c.metrics for t in (m, "val/" + m.removeprefix("test/"))}
    read |= {spec.sizing_metric, "train/loss"}
    metrics = {ax.get_title().split(": ")[-1] for ax in axes}
    assert metrics <= read and spec.sizing_metric in metrics, metrics
    assert all(ax.yaxis.get_offset_text().get_text() == "" for ax in axes)
