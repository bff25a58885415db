"""LiCE: the declared per-dataset likelihood claims (two metrics of one run, paired by seed) as verdict objects, and
the hook's tables."""

from __future__ import annotations

from pathlib import Path

from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord
from suite.stats import NOT_REPRODUCED, REPRODUCED, UNDERFIT

FLAT = [(0, 0.5), (10, 0.98), (15, 0.99), (20, 0.99)]
RISING = [(0, 0.5), (10, 0.6), (15, 0.7), (20, 0.9)]


def _rec(name, seed, ll, curve=FLAT):
    m = {"test/acc": 0.9, "test/threshold": -3.0}
    for method, v in zip(("mio", "lice_threshold", "lice_optimize", "dice"), ll, strict=True):
        m |= {f"test/{method}/spn_ll": v + 0.3 * seed * (method == "lice_optimize"), f"test/{method}/valid": 1.0}
        m |= {f"test/{method}/distance": 1.0 + (method != "mio") * 0.1}
    return RunRecord(Path(name), name, seed, m, {"val/acc": curve}, {"data": {"seed": seed}})


def _judge(records, tmp_path):
    spec = ClaimSpec.from_dict("lice", load_spec("lice"))
    verdicts, _, result, hook_md, _, _ = judge_page(spec, records, tmp_path)
    assert hook_md == ""
    return {v.id: v for v in verdicts}, result


def test_lice_likelihood_claims_per_dataset(tmp_path):
    recs = [_rec("adult", s, (-7.0, -4.0, -3.0, -7.2)) for s in range(3)]  # +4 nats over the MIO, +4.2 over DiCE
    recs += [_rec("german", s, (-10.0, -9.0, -9.9, -10.2), RISING) for s in range(3)]  # classifier still learning
    by_id, result = _judge(recs, tmp_path)
    mio, dice = by_id["adult_lice_vs_mio"], by_id["adult_lice_vs_dice"]
    assert mio.verdict == REPRODUCED and mio.paired and mio.primary and mio.lo > 0.5 and mio.published == -0.35
    assert dice.verdict == REPRODUCED and not dice.primary and dice.published == 2.87 and dice.p_holm is None
    assert mio.values == {
        "adult:test/lice_optimize/spn_ll": {"0": -3.0, "1": -2.7, "2": -2.4},
        "adult:test/mio/spn_ll": {"0": -7.0, "1": -7.0, "2": -7.0},
    }
    # the dataset's classifier still learning: its claims read underfit, the converged dataset's are untouched
    assert by_id["german_lice_vs_mio"].verdict == UNDERFIT and "german:" in by_id["german_lice_vs_mio"].why
    # no gain, with an interval tightly below delta (0.5 nats): no effect of the paper's size
    small = [_rec("adult", s, (-7.0, -4.0, -7.2 + (0.01, -0.01, 0.02)[s] - 0.3 * s, -7.2)) for s in range(3)]
    v = _judge(small, tmp_path)[0]["adult_lice_vs_dice"]
    assert v.verdict == NOT_REPRODUCED and v.hi < 0.5 and "as large as delta" in v.why
    methods = result.tables[0]
    assert [r[:2] for r in methods.rows][:4] == [
        ["adult", m] for m in ("mio", "lice_threshold", "lice_optimize", "dice")
    ]
    cost = result.tables[1].rows[0]
    assert cost[0] == "adult" and cost[3] == "+3.00" and cost[5] == "+4.30" and cost[6] == "+0.10"


def test_paper_profile_declares_the_papers_datasets():
    spec = ClaimSpec.from_dict("lice", load_spec("lice", profile="paper"))
    claims = {c.id: c for c in spec.claims}
    assert sorted(claims) == sorted(f"{d}_lice_vs_{b}" for d in ("gmsc", "adult", "credit") for b in ("mio", "dice"))
    assert claims["gmsc_lice_vs_mio"].primary and claims["gmsc_lice_vs_mio"].published == 2.25
    assert claims["credit_lice_vs_dice"].metrics == ("test/lice_optimize/spn_ll", "test/dice/spn_ll")
