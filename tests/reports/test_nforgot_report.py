"""reports/nforgot.py: verdicts from the numbers (reproduced, not reproduced, phenomenon absent, underfit), judged on
the validation accuracy (a one-class task's decaying validation loss must not read as underfit)."""

from __future__ import annotations

from pathlib import Path

from reports.nforgot import claim_report
from suite.compare import RunRecord

# (AP, AF) per school entry; N-ForGOT best in AP and AF
SCHOOL = {
    "finetune": (0.70, 0.30),
    "joint": (0.95, 0.00),
    "ewc": (0.72, 0.28),
    "lwf": (0.75, 0.25),
    "replay": (0.80, 0.20),
    "nforgot": (0.90, 0.05),
    "nforgot_no_class": (0.85, 0.15),
    "nforgot_released": (0.76, 0.24),
}


def _records(tmp_path: Path, table: dict, ds: str = "school", acc_rising: bool = False) -> list[RunRecord]:
    out = []
    for name, (ap, af) in table.items():
        for seed in range(3):
            j = 0.005 * seed
            metrics = {"test/ap": ap + j, "test/af": af + j, "test/acc": ap + j, "test/tasks": 3.0}
            metrics |= {"test/ap_after_0": 1.0, "test/ap_after_1": ap + 0.05, "test/ap_after_2": ap + j}
            metrics |= {"test/af_after_1": af / 2, "test/af_after_2": af + j, "test/bwt": -af}
            # validation loss of a one-class task: geometric decay to 0, never flat; accuracy saturated at 1
            loss = [(i, 0.5**i) for i in range(10)]
            acc = (
                [(i, 0.5 + 0.05 * i) for i in range(10)]
                if acc_rising
                else [(i, min(1.0, 0.7 + 0.1 * i)) for i in range(10)]
            )
            out.append(RunRecord(tmp_path, f"{ds}_{name}", seed, metrics, {"val/loss": loss, "val/acc": acc}))
    return out


def _verdict(page: str, claim: str) -> str:
    row = next(line for line in page.splitlines() if claim in line)
    return row.split("|")[2].strip()


def test_verdicts_follow_the_numbers_and_the_accuracy_plateau(tmp_path: Path):
    page = claim_report(_records(tmp_path, SCHOOL), tmp_path)
    assert _verdict(page, "[school] N-ForGOT has higher average accuracy (AP)") == "**reproduced**"
    assert _verdict(page, "[school] N-ForGOT has lower average forgetting (AF)") == "**reproduced**"
    assert _verdict(page, "[school] L_class (inter-class connectivity) reduces forgetting") == "**reproduced**"
    row = "| nforgot | 1.000 ± 0.000 | 0.950 ± 0.000 | 0.905 ± 0.005 | 0.025 ± 0.000 | 0.055 ± 0.005 | -0.050 ± 0.000 |"
    assert row in page  # AP / AF after every task, from the metrics
    worse = {**SCHOOL, "nforgot": (0.60, 0.40)}
    page = claim_report(_records(tmp_path, worse), tmp_path)
    assert _verdict(page, "[school] N-ForGOT has higher average accuracy (AP)") == "**not reproduced**"


def test_no_forgetting_is_phenomenon_absent_and_a_rising_accuracy_is_underfit(tmp_path: Path):
    calm = {k: (ap, 0.01 if k != "nforgot" else 0.0) for k, (ap, _) in SCHOOL.items()}
    page = claim_report(_records(tmp_path, calm), tmp_path)
    assert _verdict(page, "[school] N-ForGOT has lower average forgetting (AF)").startswith(
        "**inconclusive: phenomenon absent**"
    )
    rising = claim_report(_records(tmp_path, SCHOOL, acc_rising=True), tmp_path)
    assert _verdict(rising, "[school] N-ForGOT has higher average accuracy (AP)") == "**inconclusive: underfit**"
    assert "not plateaued" in rising


def test_pubmed_one_class_tasks_are_judged_on_accuracy(tmp_path: Path):
    # the loss curve decays geometrically (never a plateau by the rule); the accuracy is flat at 1: tested
    page = claim_report(_records(tmp_path, SCHOOL, ds="pubmed"), tmp_path)
    claim = "[pubmed, outside the official protocol] N-ForGOT has higher average accuracy (AP)"
    assert _verdict(page, claim) == "**reproduced**"
    # single-head rows are listed apart from the paper verdicts
    assert page.index("## Outside the official protocol") < page.index(claim)
    assert "No multi-head setting has finished entries." in page


def test_a_saturated_setting_reads_phenomenon_absent_for_ap_too(tmp_path: Path):
    # finetune forgets (AF 0.10) but loses only 0.05 AP to joint: the methods cannot be ranked on forgetting
    saturated = {**SCHOOL, "finetune": (0.90, 0.10), "joint": (0.95, 0.0), "nforgot": (0.99, 0.01)}
    page = claim_report(_records(tmp_path, saturated), tmp_path)
    for what in ("higher average accuracy (AP)", "lower average forgetting (AF)"):
        assert _verdict(page, f"[school] N-ForGOT has {what}").startswith("**inconclusive: phenomenon absent**")
    assert _verdict(page, "[school] L_class (inter-class connectivity) reduces forgetting").startswith(
        "**inconclusive: phenomenon absent**"
    )
    assert "finetune loses only 0.050 AP to joint" in page
    # the same numbers in a setting where finetune loses 0.25 AP: judged
    page = claim_report(_records(tmp_path, {**saturated, "finetune": (0.70, 0.10)}, ds="school2d"), tmp_path)
    assert _verdict(page, "[school2d] N-ForGOT has higher average accuracy (AP)") == "**reproduced**"
