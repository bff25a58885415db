"""What one wandb row costs the training thread: Lightning's synchronous ``WandbLogger.log_metrics`` vs the suite's
``AsyncWandbLogger`` (``suite/loggers.py``), which only queues the row for a background thread.

Both loggers write an offline run in a temporary folder and log the same rows (``--rows`` per round, the metric dict
a training step logs); the time counted is the ``log_metrics`` calls alone, on the calling thread (the async
logger's flush at the end of a round is not counted: it runs off the training step). The two are interleaved over
``--rounds`` rounds so drift on a shared machine hits both alike; each round gives a ratio async/sync, and the
summary is their geometric mean with a 95% Student-t interval over the rounds (on the log ratios,
``benchmarks/_timing.py``). The suite's claim: queueing is much cheaper than logging (goal: async/sync <= 0.1, met
only when the interval's upper end is below it).

    python benchmarks/wandb_log_cost.py [--rounds 7] [--rows 200] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import add_args, describe, header, ratio_interval, round_order, rounds_of  # noqa: E402
from suite.loggers import make_wandb_logger  # noqa: E402

GOAL = 0.1


def per_row_seconds(async_log: bool, rows: int, folder: Path) -> float:
    """Mean seconds one ``log_metrics`` call takes on the calling thread, over ``rows`` rows of one fresh run."""
    logger = make_wandb_logger(str(folder), project="bench", mode="offline", async_log=async_log)
    if logger is None:
        raise SystemExit("error: wandb could not start an offline run here (see the warning above)")
    logger.log_metrics({"warmup": 0.0}, step=0)  # starts the run (and the async logger's thread) outside the timing
    if async_log:
        logger.flush()
    t0 = time.perf_counter()
    for step in range(1, rows + 1):
        logger.log_metrics({"train/loss_step": 1.0 / step, "lr-SGD": 0.01, "epoch": 0.0}, step=step)
    elapsed = time.perf_counter() - t0
    logger.experiment.finish()  # waits for the async logger's queue; not counted
    return elapsed / rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="rows logged per logger and round")
    add_args(parser, rounds=7)
    args = parser.parse_args(argv)
    rounds = rounds_of(parser, args)
    if args.quick:
        args.rows = 20
    os.environ.setdefault("WANDB_SILENT", "true")
    sync_s, async_s = [], []
    with tempfile.TemporaryDirectory(prefix="wandb-log-cost-") as tmp:
        for r in range(rounds):
            for async_log in round_order([False, True], r):  # alternate which goes first
                sec = per_row_seconds(async_log, args.rows, Path(tmp) / f"{r}-{int(async_log)}")
                (async_s if async_log else sync_s).append(sec)
            print(
                f"round {r + 1}: sync {1e6 * sync_s[-1]:8.1f} us/row, async {1e6 * async_s[-1]:6.1f} us/row, "
                f"ratio {async_s[-1] / sync_s[-1]:.4f}"
            )
    iv = ratio_interval(async_s, sync_s)
    med_sync, med_async = 1e6 * statistics.median(sync_s), 1e6 * statistics.median(async_s)
    print(f"median per row: sync {med_sync:.1f} us, async {med_async:.1f} us")
    print(header(rounds))
    print(f"async/sync: {describe(iv, goal=GOAL)}")


if __name__ == "__main__":
    main()
