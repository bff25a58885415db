"""Report hooks of the rx_dpm and sgm_lipschitz claims: sweep parsing, measured orders, stated verdicts (the
mixture's ODE error and the quadrature are deterministic: no interval), OU conversion."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from reports.rx_dpm import EULER_CLAIM, measured_order, sweep_table, verdicts
from reports.rx_dpm import claim_report as rx_dpm_report
from reports.sgm_lipschitz import _learned
from reports.sgm_lipschitz import claim_report as sgm_report
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord

RX = ClaimSpec.from_dict("rx_dpm", load_spec("rx_dpm"))


def _record(name: str, orders: dict[str, float], seed: int = 0) -> RunRecord:
    """Synthetic sweep metrics err = NFE^-p (Heun spends NFE - 1 on a grid ending at 0)."""
    metrics = {}
    for method, p in orders.items():
        for n in (6, 10, 18, 34):
            used = n - 1 if "heun" in method else n
            key = f"test/sweep/{method}/nfe{n}"
            metrics |= {f"{key}/ode_err": used**-p, f"{key}/w2": 0.5, f"{key}/nfe": float(used)}
    metrics["test/ref_gap_scipy"] = 1e-6
    return RunRecord(Path(name), name, seed, metrics)


def _by_id(records: list, tmp_path: Path) -> dict:
    verdicts_, *_ = judge_page(RX, records, tmp_path)
    return {v.id: v for v in verdicts_}


def test_sweep_table_orders_and_verdict(tmp_path):
    orders = {"euler": 1.0, "rx_euler": 2.0, "rx_euler_naive": 1.5, "heun": 2.0, "rx_heun": 3.0}
    recs = [_record("mixture_edm", orders, 0), _record("mixture_edm", orders, 1)]
    sweep = sweep_table(recs)
    assert sorted(sweep) == sorted(orders) and sorted(sweep["heun"]) == [6, 10, 18, 34]
    assert sweep["heun"][10]["nfe"] == 9
    for method, p in orders.items():
        assert measured_order(sweep[method]) == pytest.approx(p, abs=1e-9)
    result = rx_dpm_report(recs, RX, tmp_path)
    notes = "\n".join(result.notes)
    assert "largest budgets 1.00 -> 2.00" in notes and "largest budgets 2.00 -> 3.00" in notes
    assert "adapted better at NFE [6, 10, 18, 34]" in notes  # naive is the slower one here
    table = result.tables[0]
    heun = next(r for r in table.rows if r[0] == "Heun")
    assert heun[2].endswith("[NFE 9]") and heun[4].endswith("[NFE 33]")  # the NFE Heun actually spent
    assert table.columns[-1] == "order" and heun[-1] == "2.00"
    assert (tmp_path / "rx_dpm_sweep.png").exists() and "no finished run `fmnist`" in notes
    by_id = _by_id(recs, tmp_path)
    every = by_id["mixture_edm_rx_every_solver"]
    assert every.verdict == "reproduced" and every.primary and every.diff is None  # stated: deterministic, no interval
    assert by_id["mixture_edm_order"].verdict == "reproduced"
    assert by_id["mixture_edm_adapted_vs_naive"].verdict == "reproduced"
    assert by_id["mixture_edm_rx_euler"].verdict == "reproduced" and by_id["mixture_edm_rx_euler"].text.startswith(
        EULER_CLAIM
    )
    worse = _by_id([_record("mixture_edm", {"euler": 1.0, "rx_euler": 0.9})], tmp_path)  # RX slower: loses everywhere
    got = worse["mixture_edm_rx_every_solver"]
    assert (
        got.verdict == "not reproduced" and got.evidence == "Euler/DDIM -> RX-Euler/DDIM: better at 0/4, worse at 4/4"
    )
    assert worse["mixture_edm_order"].verdict == "not reproduced"


def _image_record(name, seed, rx_gain, curve, dataset):
    """An image entry's run: FID of each base solver 20 / NFE, RX's ``rx_gain`` times that, and its val/loss curve."""
    metrics = {"val/loss": curve[-1][1]}
    for base in ("euler", "heun"):
        for n in (6, 10, 20, 40):
            fid = 20.0 / n
            for method, v in ((base, fid), (f"rx_{base}", fid * rx_gain)):
                metrics[f"test/sweep/{method}/nfe{n}/fid"] = v
                metrics[f"test/sweep/{method}/nfe{n}/nfe"] = float(n)
    config = {
        "model": {"net": {"channels": 16}, "n_eval_samples": 360, "image_downsample": 1},
        "data": {"dataset": dataset},
        "trainer": {"max_epochs": 10},
    }
    return RunRecord(Path(f"{name}/{seed}"), name, seed, metrics, {"val/loss": curve}, config)


def test_each_image_entry_gets_its_own_fid_verdict(tmp_path):
    falling = [(s, 1.0 - 0.05 * s) for s in range(10)]  # still improving at the end: underfit
    flat = [(s, 0.5 + 0.3 * 0.5**s) for s in range(30)]  # converged
    recs = [_image_record("fmnist", s, 0.5, falling, "fashion_mnist") for s in (0, 1)]
    recs += [_image_record("digits", s, 0.5, flat, "digits") for s in (0, 1)]
    by_id = _by_id(recs, tmp_path)
    fmnist = by_id["fmnist_rx_every_solver"]
    assert fmnist.verdict == "inconclusive: underfit" and "still improving" in fmnist.why
    assert by_id["digits_rx_every_solver"].verdict == "reproduced"
    assert by_id["fmnist_rx_euler"].verdict == "inconclusive: underfit"
    result = rx_dpm_report(recs, RX, tmp_path)
    titles = {t.title: t for t in result.tables}
    digits = titles["Trained image model: digits (FID per NFE)"]
    assert "sklearn's digits (fixed 80/20 train/test split), 8x8" in digits.note
    assert "final val/loss 0.5000 (mean of 2 seeds)" in digits.note
    assert "28x28 -> 28x28" in titles["Trained image model: Fashion-MNIST (FID per NFE)"].note
    # RX worse on the converged subject at one budget: not reproduced, with the counts
    worse = [_image_record("digits", 0, 0.5, flat, "digits")]
    worse[0].metrics["test/sweep/rx_heun/nfe6/fid"] = 10.0
    conv = {"digits": (True, "converged")}
    got = {v.id: v for v in verdicts(worse, conv)}
    assert got["digits_rx_every_solver"].verdict == "not reproduced"
    assert "Heun -> RX-Heun: better at 3/4, worse at 1/4" in got["digits_rx_every_solver"].evidence
    # ... while RX-Euler alone (the official construction) still wins at every budget: its own row says so
    euler = got["digits_rx_euler"]
    assert (
        euler.verdict == "reproduced" and euler.evidence == "Euler/DDIM -> RX-Euler/DDIM: better at 4/4, worse at 0/4"
    )
    assert {v.id: v for v in verdicts(worse)}["digits_rx_euler"].verdict == "inconclusive: underfit"  # no curve
    # the coefficient ablation by FID: naive coefficients 10% better than the adapted ones at NFE 10 only
    ablation = [_image_record("digits", 0, 0.5, flat, "digits")]
    for n in (6, 10, 20, 40):
        adapted = ablation[0].metrics[f"test/sweep/rx_euler/nfe{n}/fid"]
        ablation[0].metrics[f"test/sweep/rx_euler_naive/nfe{n}/fid"] = adapted * (0.9 if n == 10 else 1.2)
    got = {v.id: v for v in verdicts(ablation, conv)}["digits_adapted_vs_naive"]
    assert got.verdict == "not reproduced" and "better at 3/4, worse at 1/4" in got.evidence
    assert "no finished run `fmnist`" in "\n".join(rx_dpm_report(worse, RX, tmp_path).notes)


def test_per_budget_lines_use_the_verdicts_margins(tmp_path):
    rec = _record("mixture_edm", {"euler": 1.0, "rx_euler": 1.0})
    for n in (6, 10, 18, 34):  # RX 0.5% better everywhere: inside the 1% margin, so neither better nor worse
        rec.metrics[f"test/sweep/rx_euler/nfe{n}/ode_err"] *= 0.995
    rec.metrics["test/sweep/rx_euler/nfe34/ode_err"] = 0.9 * n**-1.0  # and 10% better at NFE 34
    got = _by_id([rec], tmp_path)["mixture_edm_rx_euler"]
    assert got.verdict == "inconclusive: within noise"
    assert got.evidence == "Euler/DDIM -> RX-Euler/DDIM: better at 1/4, worse at 0/4"
    result = rx_dpm_report([rec], RX, tmp_path)
    notes = "\n".join(result.notes)
    assert "RX on Euler/DDIM (error): better at NFE [34], worse at NFE none, within 1% at NFE [6, 10, 18]" in notes
    assert "beyond a 1% relative margin on the pathwise error (5% on the FID" in notes


def test_learned_lipschitz_is_converted_to_ou_time():
    rec = RunRecord(Path("s"), "segment", 0, {"test/lip_learned_0": 2.0}, config={"model": {"lipschitz_sigmas": [1.0]}})
    ts, vals = _learned([rec], "segment")
    assert ts == pytest.approx([0.5 * math.log(2.0)]) and vals == pytest.approx([4.0])  # e^{2t} = 1 + sigma^2
    assert _learned([rec], "ring") == ([], [])


def test_sgm_lipschitz_states_the_exact_verdicts(tmp_path):
    """The three results are exact quadrature: stated verdicts (no interval), primary; the learned constant of a
    one-seed run is a context table, never a verdict."""
    spec = ClaimSpec.from_dict("sgm_lipschitz", load_spec("sgm_lipschitz"))
    sigmas = [0.0447, 0.2555, 2.5277]
    learned = {f"test/lip_learned_{i}": v for i, v in enumerate([300.0, 12.0, 0.3])}
    rec = RunRecord(Path("s"), "segment", 0, learned, config={"model": {"lipschitz_sigmas": sigmas}})
    result = sgm_report([rec], spec, tmp_path)
    by_id = {v.id: v for v in result.verdicts}
    assert set(by_id) == {"blowup_at_tstar", "manifold_one_over_t", "logconcave_band"}
    for v in by_id.values():
        assert v.verdict == "reproduced" and v.primary and v.diff is None and "deterministic" in v.why
    assert (
        "slope -0.99" in by_id["manifold_one_over_t"].evidence or "slope -1.0" in by_id["manifold_one_over_t"].evidence
    )
    segment = next(t for t in result.tables if t.title.startswith("(b) Segment: learned"))
    assert len(segment.rows) == 3 and segment.columns[-1] == "learned / exact"
    assert (tmp_path / "sgm_lipschitz_study.png").exists()
