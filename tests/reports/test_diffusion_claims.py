"""Report hooks of the rx_dpm and sgm_lipschitz claims: sweep parsing, measured orders, verdict lines, OU conversion."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from reports.rx_dpm import claim_report as rx_dpm_report
from reports.rx_dpm import measured_order, sweep_table
from reports.sgm_lipschitz import _learned
from suite.compare import RunRecord


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


def test_sweep_table_orders_and_verdict(tmp_path):
    orders = {"euler": 1.0, "rx_euler": 2.0, "rx_euler_naive": 1.5, "heun": 2.0, "rx_heun": 3.0}
    recs = [_record("mixture_edm", orders, 0), _record("mixture_edm", orders, 1)]
    sweep = sweep_table(recs)
    assert sorted(sweep) == sorted(orders) and sorted(sweep["heun"]) == [6, 10, 18, 34]
    assert sweep["heun"][10]["nfe"] == 9
    for method, p in orders.items():
        assert measured_order(sweep[method]) == pytest.approx(p, abs=1e-9)
    page = rx_dpm_report(recs, tmp_path)
    assert "largest budgets 1.00 -> 2.00" in page and "largest budgets 2.00 -> 3.00" in page
    assert "adapted better at NFE [6, 10, 18, 34]" in page  # naive is the slower one here
    assert "9.99e-05 [NFE 33]" not in page and "[NFE 9]" in page  # Heun's actual NFE is shown
    assert (tmp_path / "rx_dpm_sweep.png").exists() and "No finished run `fmnist`" in page


def test_learned_lipschitz_is_converted_to_ou_time():
    rec = RunRecord(Path("s"), "segment", 0, {"test/lip_learned_0": 2.0}, config={"model": {"lipschitz_sigmas": [1.0]}})
    ts, vals = _learned([rec], "segment")
    assert ts == pytest.approx([0.5 * math.log(2.0)]) and vals == pytest.approx([4.0])  # e^{2t} = 1 + sigma^2
    assert _learned([rec], "ring") == ([], [])
