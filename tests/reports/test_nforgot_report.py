"""reports/nforgot.py with conf/claim/nforgot.yaml: verdicts from the numbers (reproduced, not reproduced, phenomenon
absent, underfit), N-ForGOT against each setting's best baseline built in the hook, convergence judged on the sizing
metric of the spec the hook is given (the mean validation accuracy over the tasks seen so far on the CPU profile,
read over the last task: a one-class task's decaying validation loss must not read as underfit)."""

from __future__ import annotations

from pathlib import Path

from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord

# (AP, AF) per entry of a setting; N-ForGOT best in AP and AF
TABLE = {
    "finetune": (0.70, 0.30),
    "joint": (0.95, 0.00),
    "ewc": (0.72, 0.28),
    "lwf": (0.75, 0.25),
    "replay": (0.80, 0.20),
    "nforgot": (0.90, 0.05),
    "nforgot_no_class": (0.85, 0.15),
    "nforgot_released": (0.76, 0.24),
}


def _records(
    tmp_path: Path, table: dict, ds: str = "school4d", acc_rising: bool = False, own: tuple = (1.0, 1.0, 1.0)
) -> list[RunRecord]:
    out = []
    for k, (name, (ap, af)) in enumerate(table.items()):
        for seed in range(3):
            j = 0.005 * ((seed + k) % 3 - 1)  # per-seed noise that differs between entries: a paired interval
            metrics = {"test/ap": ap + j, "test/af": af + j, "test/acc": ap + j, "test/tasks": 3.0}
            metrics |= {"test/ap_after_0": 1.0, "test/ap_after_1": ap + 0.05, "test/ap_after_2": ap + j}
            metrics |= {"test/af_after_1": af / 2, "test/af_after_2": af + j, "test/bwt": -af}
            metrics |= {f"test/acc_own_task{t}": a + j for t, a in enumerate(own)}  # right after task t's training
            # validation loss of a one-class task: geometric decay to 0, never flat; the accuracy over the seen tasks
            # (the sizing metric) saturated at 1 or still rising; the current task's accuracy the other way round,
            # so a hook reading it would decide otherwise
            loss = [(i, 0.5**i) for i in range(10)]
            rising = [(i, 0.5 + 0.05 * i) for i in range(10)]
            flat = [(i, min(1.0, 0.7 + 0.1 * i)) for i in range(10)]
            task = [(i, float(min(i // 4, 2))) for i in range(10)]  # tasks 0, 1, 2; the last holds 2 validations
            curves = {
                "val/loss": loss,
                "val/acc_seen": rising if acc_rising else flat,
                "val/acc": flat if acc_rising else rising,
                "val/task": task,
            }
            out.append(RunRecord(tmp_path, f"{ds}_{name}", seed, metrics, curves, config={"data": {"seed": seed}}))
    return out


def _page(tmp_path: Path, records: list[RunRecord], **override):
    spec = ClaimSpec.from_dict("nforgot", {**load_spec("nforgot"), **override})
    verdicts, _, result, hook_md, _, _ = judge_page(spec, records, tmp_path)
    assert not hook_md  # the hook returns data, and did not fail
    return {v.id: v for v in verdicts}, result


def test_verdicts_follow_the_numbers_and_the_accuracy_plateau(tmp_path: Path):
    by_id, result = _page(tmp_path, _records(tmp_path, TABLE))
    ap, af = by_id["school4d_ap_vs_best"], by_id["school4d_af_vs_best"]
    assert ap.verdict == af.verdict == "reproduced"
    assert ap.entries == ("school4d_nforgot", "school4d_replay") and af.entries == ap.entries
    assert ap.paired and ap.primary and ap.p_holm is not None  # the headline, with Holm across the primaries
    assert abs(ap.diff - 0.10) < 1e-9 and 0 < ap.lo < ap.diff < ap.hi
    assert abs(af.diff - 0.15) < 1e-9  # AF is lower-is-better: positive = N-ForGOT forgets less
    lclass = by_id["school4d_lclass"]  # a declared ablation
    assert lclass.verdict == "reproduced" and lclass.paired and not lclass.primary
    assert by_id["school4d_joint_vs_finetune"].verdict == "reproduced"
    table = next(t for t in result.tables if t.title.startswith("Per-task results: SocioPatterns primary school, 4-d"))
    row = next(r for r in table.rows if r[0] == "nforgot")
    assert row[1] == "1 ± 0 (n=3)" and row[2] == "0.95 ± 0 (n=3)" and row[3].startswith("0.9 ± 0.005")
    worse = {**TABLE, "nforgot": (0.60, 0.40)}
    by_id, _ = _page(tmp_path, _records(tmp_path, worse))
    assert by_id["school4d_ap_vs_best"].verdict == "not reproduced"
    assert by_id["school4d_ap_vs_best"].hi < 0


def test_no_forgetting_is_phenomenon_absent_and_a_rising_accuracy_is_underfit(tmp_path: Path):
    calm = {k: (ap, 0.01 if k != "nforgot" else 0.0) for k, (ap, _) in TABLE.items()}
    by_id, result = _page(tmp_path, _records(tmp_path, calm))
    for cid in ("school4d_af_vs_best", "school4d_ap_vs_best", "school4d_lclass", "school4d_grad_vs_released"):
        assert by_id[cid].verdict == "inconclusive: phenomenon absent", cid
        assert "finetune forgets only" in by_id[cid].why
    assert by_id["school4d_joint_vs_finetune"].verdict == "reproduced"  # the design check is never absent
    rows = next(t for t in result.tables if t.title == "Is there forgetting to prevent?").rows
    assert rows[0][0] == "school4d" and rows[0][4].startswith("no: finetune forgets only")
    assert rows[0][1] == "1.000 (task 0)"  # every task learned at its own end
    by_id, _ = _page(tmp_path, _records(tmp_path, TABLE, acc_rising=True))
    ap = by_id["school4d_ap_vs_best"]
    assert ap.verdict == "inconclusive: underfit" and "not converged" in ap.why and ap.lo > 0
    assert by_id["school4d_lclass"].verdict == "inconclusive: underfit"
    assert by_id["school4d_joint_vs_finetune"].verdict == "reproduced"  # converge: []


def test_an_af_claim_against_an_entry_that_barely_forgets_is_absent(tmp_path: Path):
    # the setting forgets (finetune AF 0.30), but the entry L_class is compared with already forgets < 0.05
    by_id, _ = _page(tmp_path, _records(tmp_path, {**TABLE, "nforgot_no_class": (0.85, 0.03)}))
    assert by_id["school4d_lclass"].verdict == "inconclusive: phenomenon absent"
    assert "school4d_nforgot_no_class forgets only" in by_id["school4d_lclass"].why
    assert by_id["school4d_af_vs_best"].verdict == "reproduced"


def test_pubmed_one_class_tasks_are_judged_on_accuracy_of_the_spec_given(tmp_path: Path):
    # the loss curve decays geometrically (never converged by the rule); the accuracy is flat at 1: tested
    records = _records(tmp_path, TABLE, ds="pubmed")
    by_id, result = _page(tmp_path, records)
    ap = by_id["pubmed_ap_vs_best"]
    assert ap.verdict == "reproduced" and not ap.primary
    assert ap.text.startswith("[pubmed, outside the official protocol]")
    assert any("outside the official protocol" in n for n in result.notes)
    # the hook reads the convergence rule of the spec it is given, not the CPU spec on disk
    by_id, _ = _page(tmp_path, records, sizing_metric="val/loss", sizing_higher_is_better=False)
    assert by_id["pubmed_ap_vs_best"].verdict == "inconclusive: underfit"
    assert "1.95e-05" in by_id["pubmed_ap_vs_best"].why  # the loss curve's tolerance: 1% of 0.5**9


def test_a_saturated_setting_reads_phenomenon_absent_for_ap_too(tmp_path: Path):
    # finetune forgets (AF 0.10) but loses only 0.03 AP to joint: the methods cannot be ranked on forgetting
    saturated = {**TABLE, "finetune": (0.93, 0.10), "joint": (0.96, 0.0), "nforgot": (0.99, 0.01)}
    by_id, _ = _page(tmp_path, _records(tmp_path, saturated, ds="school"))
    for cid in ("school_ap_vs_best", "school_af_vs_best"):
        assert by_id[cid].verdict == "inconclusive: phenomenon absent"
        assert "finetune loses only 0.030 AP to joint (< 0.05)" in by_id[cid].why
    # finetune loses 0.07 AP (the 4-d school's pilot): room for a 2-point effect, judged
    by_id, _ = _page(tmp_path, _records(tmp_path, {**saturated, "finetune": (0.89, 0.10)}))
    assert by_id["school4d_ap_vs_best"].verdict == "reproduced"
    assert by_id["school4d_lclass"].verdict == "reproduced"


def test_convergence_reads_the_last_task_only():
    from reports.nforgot import last_task_convergence
    from suite.claims import ClaimSpec
    from suite.compare import RunRecord

    spec = ClaimSpec.from_dict(
        "nforgot",
        {"runs": [{"name": "a"}], "sizing_metric": "val/acc", "sizing_higher_is_better": True, "evaluate": "last"},
    )
    first = [0.5, 0.8, 0.9, 0.95, 0.95]  # task 1 learned; its best stays above anything task 2 reaches
    rising = [(i, y) for i, y in enumerate(first + [0.5, 0.55, 0.6, 0.65, 0.7])]  # task 2 still learning
    flat = [(i, y) for i, y in enumerate(first + [0.5, 0.7, 0.7, 0.7, 0.7])]
    rec = lambda curve: RunRecord(None, "a", 0, {"test/tasks": 2.0}, {"val/acc": curve})  # noqa: E731
    # the whole stream reads the task switch as a run that got worse: task 1's best hides what task 2 does
    assert "got worse after its best" in spec.convergence([rec(flat)])["a"][1]
    ok, why = last_task_convergence([rec(rising)], spec)["a"]
    assert not ok and why.startswith("last task: still improving")
    assert last_task_convergence([rec(flat)], spec)["a"][0] is True


def test_the_cpu_spec_sizes_on_the_seen_tasks_accuracy_over_the_last_task():
    from reports.nforgot import last_task_convergence

    spec = ClaimSpec.from_dict("nforgot", load_spec("nforgot"))
    assert spec.sizing_metric == "val/acc_seen" and spec.higher_is_better
    # val/task marks the tasks' validations; here the last task holds fewer than a third of them, so an equal split
    # of the curve by count would mix in the task before it
    task = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    seen = [1.0, 1.0, 1.0, 1.0, 0.9, 0.9, 0.95, 0.95, 0.9, 0.9]  # settled over the last task
    current = [1.0, 1.0, 1.0, 1.0, 0.9, 0.9, 0.95, 0.95, 0.6, 0.8]  # the current task's: still rising

    def rec(sizing, other):
        curves = {
            "val/acc_seen": list(enumerate(sizing)),
            "val/acc": list(enumerate(other)),
            "val/task": [(i, float(k)) for i, k in enumerate(task)],
        }
        return RunRecord(None, "school4d_joint", 0, {"test/tasks": 3.0}, curves)

    ok, why = last_task_convergence([rec(seen, current)], spec)["school4d_joint"]
    assert ok and why.startswith("last task: converged"), why
    # the same curves swapped: the seen tasks' accuracy still rising over the last task is underfit
    ok, why = last_task_convergence([rec(current, seen)], spec)["school4d_joint"]
    assert not ok and why.startswith("last task: still improving"), why


def test_a_task_never_learned_at_its_own_end_makes_the_phenomenon_absent(tmp_path: Path):
    by_id, result = _page(tmp_path, _records(tmp_path, TABLE, own=(1.0, 0.55, 0.95)))
    for cid in ("school4d_ap_vs_best", "school4d_af_vs_best", "school4d_lclass"):
        assert by_id[cid].verdict == "inconclusive: phenomenon absent", cid
        assert "finetune never learns task 1 0.55" in by_id[cid].why
    assert by_id["school4d_joint_vs_finetune"].verdict == "reproduced"
    row = next(t for t in result.tables if t.title == "Is there forgetting to prevent?").rows[0]
    assert row[1] == "0.550 (task 1)" and row[4].startswith("no: finetune never learns task 1")
    by_id, _ = _page(tmp_path, _records(tmp_path, TABLE, own=(1.0, 0.8, 0.95)))  # every task learned: judged
    assert by_id["school4d_ap_vs_best"].verdict == "reproduced"
