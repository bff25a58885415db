"""RX-DPM claim check on the exact-score 2-D mixture: error vs NFE for each solver with and without RX, the measured
convergence order, the grid-adapted vs naive (2, -1) ablation, and (``--images``) sample quality of a U-Net trained
on sklearn digits (FID on an in-suite feature CNN). Writes docs/results/rx_dpm_tables.md (embedded in the results
page rx_dpm.md) and rx_dpm.png.

    .venv/bin/python -m benchmarks.rx_dpm_claim [--images | --only-images]   (--only-images -> rx_dpm_images.md)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from datamodules.mixtures import make_mixture
from lightning_modules.diffusion import w2_empirical
from ops.samplers import karras_sigmas, rx_sample, sample, vp_sigmas, vp_time_grid
from ops.samplers.reference import reference_solve
from ops.scores.gmm import gmm_denoiser, gmm_sample, gmm_score

D64 = torch.float64
OUT = Path("docs/results")

# name -> (runner(den, x, sigmas), steps for a given NFE on a grid ending at 0)
METHODS = {
    "Euler": (lambda d, x, s: sample(d, x, s, "euler"), lambda nfe: nfe),
    "RX-Euler (adapted)": (lambda d, x, s: rx_sample(d, x, s, "euler", 2, "adapted"), lambda nfe: nfe),
    "RX-Euler (naive 2,-1)": (lambda d, x, s: rx_sample(d, x, s, "euler", 2, "naive"), lambda nfe: nfe),
    "RX-Euler k=3": (lambda d, x, s: rx_sample(d, x, s, "euler", 3, "adapted"), lambda nfe: nfe),
    "Heun": (lambda d, x, s: sample(d, x, s, "heun"), lambda nfe: (nfe + 1) // 2),
    "DPM-Solver-2": (lambda d, x, s: sample(d, x, s, "dpm2"), lambda nfe: (nfe + 1) // 2),
    "DPM-Solver++(2M)": (lambda d, x, s: sample(d, x, s, "dpmpp_2m"), lambda nfe: nfe),
    "RX-DPM-Solver++(2M)": (lambda d, x, s: rx_sample(d, x, s, "dpmpp_2m", 2, "adapted"), lambda nfe: nfe),
    "RX-DPM-Solver++(2M) naive": (lambda d, x, s: rx_sample(d, x, s, "dpmpp_2m", 2, "naive"), lambda nfe: nfe),
}
NFES = (6, 8, 10, 14, 18, 26, 34, 50)


def mixture_study(n_points: int, seed: int, ref_steps: int = 2048) -> tuple[list[str], dict]:
    w, mu, cov = make_mixture("ring2d", n_components=8, scale=2.0, component_std=0.3)
    den = lambda x, s: gmm_denoiser(x, s, w, mu, cov)  # noqa: E731
    g = torch.Generator().manual_seed(seed)
    lines, curves = [], {}
    for grid_name in ("edm", "vp_uniform"):
        if grid_name == "edm":
            make = lambda n: karras_sigmas(n, 0.002, 80.0, 7.0)  # noqa: E731
            x_t = torch.randn(n_points, 2, generator=g, dtype=D64) * 80.0
            end_alpha = 1.0
        else:
            make = lambda n: vp_sigmas(vp_time_grid(n, kind="uniform"))[0]  # noqa: E731
            sig1, alpha = vp_sigmas(vp_time_grid(1, kind="uniform"))
            x_t = torch.randn(n_points, 2, generator=g, dtype=D64) / float(alpha[0])
            end_alpha = float(alpha[-1])
        fine = make(ref_steps)
        ref = sample(den, x_t, fine, "dpm2").x
        # Check the fine reference against scipy solve_ivp on a few points (same ODE, to sigma_end).
        t0 = time.time()
        sp = reference_solve(
            lambda x, s: gmm_score(x, s, w, mu, cov), x_t[:4], float(fine[0]), float(fine[-1]), 1e-10, 1e-10
        )
        ref_gap = float((sp - ref[:4]).norm(dim=1).max())
        exact = gmm_sample(n_points, w, mu, cov, torch.Generator().manual_seed(seed + 7))
        desc = (
            "EDM rho=7, sigma 80 -> 0.002 -> 0" if grid_name == "edm" else "VP linear beta, uniform t 1 -> 1e-3 (DDIM)"
        )
        lines.append(f"\n### Grid `{grid_name}` ({desc})\n")
        lines.append(
            f"Reference: DPM-Solver-2 with {ref_steps} steps; its gap to scipy DOP853 (rtol 1e-10) on 4 paths: "
            f"{ref_gap:.1e} ({time.time() - t0:.0f} s).\n"
        )
        w2_floor = float(w2_empirical(ref * end_alpha, exact))
        lines.append(
            f"W2 of the reference samples to exact mixture draws (sampling-noise floor, n={n_points}): "
            f"{w2_floor:.3f}.\n"
        )
        lines.append("\nMean pathwise error |x_0 - x_0^ref| (W2 to exact draws in brackets):\n")
        lines.append("| method | " + " | ".join(f"NFE {n}" for n in NFES) + " | order |")
        lines.append("|---|" + "---|" * (len(NFES) + 1))
        for name, (run, steps) in METHODS.items():
            errs, cells, nfes = [], [], []
            for nfe in NFES:
                n = steps(nfe)
                if "k=3" in name and n < 3:
                    cells.append("-")
                    continue
                out = run(den, x_t, make(n))
                e = float((out.x - ref).norm(dim=1).mean())
                w2 = float(w2_empirical(out.x * end_alpha, exact))
                errs.append(e)
                nfes.append(out.nfe)
                cells.append(f"{e:.3g} ({w2:.2f})" + ("" if out.nfe == nfe else f" [NFE {out.nfe}]"))
            tail = slice(-4, None)
            order = -np.polyfit(np.log(nfes[tail]), np.log(errs[tail]), 1)[0]
            curves[(grid_name, name)] = (nfes, errs)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {order:.2f} |")
    return lines, curves


def image_study(steps: int, seed: int) -> list[str]:
    import lightning.pytorch as pl
    from torch.utils.data import TensorDataset

    from datamodules._base import SuiteDataModule
    from layers.diffusion import SmallUNet
    from lightning_modules.diffusion import DiffusionLitModule

    class Digits(SuiteDataModule):
        def load_embedded(self):
            from sklearn.datasets import load_digits

            d = load_digits()
            x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16
            y = torch.tensor(d.target)
            return {"train": TensorDataset(x, y), "val": TensorDataset(x[:128], y[:128]), "test": TensorDataset(x, y)}

    torch.manual_seed(seed)
    model = DiffusionLitModule(
        SmallUNet(1, channels=32, emb_dim=64), solver="euler", n_steps=10, n_eval_samples=1024, fid_feature_steps=400,
        sigma_max=80.0, optimizer=lambda p: torch.optim.Adam(p, lr=2e-3),
    )  # fmt: skip
    dm = Digits(batch_size=128, seed=seed)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
    )
    t0 = time.time()
    trainer.fit(model, datamodule=dm)
    lines = [
        f"\n## Image model: SmallUNet on sklearn digits (8x8), {steps} Adam steps ({time.time() - t0:.0f} s)\n",
        "FID on 1,024 samples vs 1,024 real digits, features of a CNN classifier trained in the suite (400 steps; "
        "not Inception, so not comparable to published FIDs; one feature net per row, seeded identically).\n",
        "| method | NFE 6 | NFE 10 | NFE 18 |",
        "|---|---|---|---|",
    ]
    for label, solver, rx, coef in (
        ("Euler", "euler", False, "adapted"),
        ("RX-Euler (adapted)", "euler", True, "adapted"),
        ("RX-Euler (naive)", "euler", True, "naive"),
        ("DPM-Solver++(2M)", "dpmpp_2m", False, "adapted"),
        ("RX-DPM-Solver++(2M)", "dpmpp_2m", True, "adapted"),
    ):
        cells = []
        for nfe in (6, 10, 18):
            model.hparams.solver, model.hparams.rx, model.hparams.rx_coefficients, model.hparams.n_steps = (
                solver,
                rx,
                coef,
                nfe,
            )
            torch.manual_seed(seed)
            out = trainer.test(model, datamodule=dm, verbose=False)[0]
            cells.append(f"{out['test/fid']:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref-steps", type=int, default=2048)
    ap.add_argument("--images", action="store_true")
    ap.add_argument("--only-images", action="store_true", help="run only the image study (-> rx_dpm_images.md)")
    ap.add_argument("--image-steps", type=int, default=1500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    if args.only_images:
        body = "\n".join(image_study(args.image_steps, args.seed))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "rx_dpm_images.md").write_text(body + f"\n\n(total {time.time() - t0:.0f} s)\n")
        print(body)
        return
    lines, curves = mixture_study(args.points, args.seed, args.ref_steps)
    if args.images:
        lines += image_study(args.image_steps, args.seed)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, grid in zip(axes, ("edm", "vp_uniform")):
        for (g, name), (nfes, errs) in curves.items():
            if g == grid:
                ax.loglog(nfes, errs, "o-" if "RX" in name else "s--", label=name, ms=3)
        ax.set_xlabel("NFE")
        ax.set_ylabel("mean |x0 - x0_ref|")
        ax.set_title(f"exact-score ring mixture, {grid} grid")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "rx_dpm.png", dpi=110)
    body = "\n".join(lines)
    (OUT / "rx_dpm_tables.md").write_text(body + f"\n\n(total {time.time() - t0:.0f} s)\n")
    print(body)


if __name__ == "__main__":
    main()
