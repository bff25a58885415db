"""DiffusionLitModule: EDM-trained denoisers (or the exact mixture denoiser) sampled with PF-ODE solvers and RX-DPM.

Serves two papers:

* ``rx_dpm`` (Choi, Kang & Han, ICLR 2025): sample with a base solver (Euler/DDIM, Heun, DPM-Solver-2,
  DPM-Solver++(2M)) with or without Richardson extrapolation (:func:`ops.samplers.rx.rx_sample`) at the same NFE.
* ``sgm_lipschitz`` (Mooney et al., ICLR 2025): the Lipschitz constant of the learned and the exact score over noise
  levels (``lipschitz_sigmas``), logged as ``test/lip_learned_<i>`` and ``test/lip_exact_<i>``.

Training is the EDM denoising loss (Karras et al. 2022, Eq. (2) with weight lambda(sigma), Eq. (8), and
ln sigma ~ N(P_mean, P_std^2)). With ``analytic=true`` and a :class:`datamodules.mixtures.GaussianMixtureDataModule`
the denoiser is the exact posterior mean (no parameters), so sampler errors are ODE-discretisation errors only.

Claim sweeps (``sweep_methods`` x ``sweep_nfes``): at test time every method (``euler``, ``heun``, ``dpm2``,
``dpmpp_2m``, or ``rx_<solver>`` with optional suffixes ``_naive`` (uniform coefficients) and ``_k3``) samples from the
same noise at each NFE budget (grid steps from :func:`ops.samplers.steps_for_nfe`) and logs
``test/sweep/<method>/nfe<NFE>/<metric>`` (``ode_err``, ``w2`` and ``nfe`` for vectors, ``fid`` for images) plus
``test/ref_gap_scipy`` (analytic mixtures: the fine reference against scipy ``solve_ivp`` on 4 paths).

Test metrics: ``test/w2`` (exact optimal-transport W2 between the generated and held-out samples, equal sizes),
``test/mmd`` (unbiased RBF MMD^2), ``test/ode_err`` (mean distance to a fine DPM-Solver-2 solve of the same ODE from
the same noise), ``test/nfe``, and for images ``test/fid`` (torchmetrics FID on a feature CNN trained here: no
Inception weights offline, so the numbers are not comparable to published FIDs).
"""

from __future__ import annotations

from typing import Any

import torch
import torchmetrics
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from core.errors import ConfigError
from core.rng import fixed_draws
from layers.diffusion.features import FeatureNet, train_feature_net
from layers.diffusion.precond import EDMPrecond
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule
from ops.samplers import (
    SAMPLERS,
    SOLVER_ORDER,
    karras_sigmas,
    nfe_of,
    recording,
    rx_sample,
    sample,
    vp_alpha_sigma,
    vp_sigmas,
    vp_time_grid,
)
from ops.samplers.reference import reference_solve
from ops.samplers.rx import COEFFICIENTS, RX_SOLVERS, SINGLESTEP_2ND
from ops.samplers.solvers import steps_for_nfe
from ops.scores.gmm import gmm_denoiser, gmm_hessian, gmm_score
from ops.scores.lipschitz import score_jacobian, spectral_norm_sym

GRIDS = ("edm", "vp_uniform", "vp_logsnr")


def parse_method(name: str) -> tuple[str, bool, str, int]:
    """``[rx_]<solver>[_naive][_k<k>]`` -> (solver, rx, coefficients, k); e.g. ``rx_heun_naive``, ``rx_euler_k3``."""
    parts = name.split("_")
    rx = parts[0] == "rx"
    parts = parts[1:] if rx else parts
    k, coef = 2, "adapted"
    if parts and parts[-1].startswith("k") and parts[-1][1:].isdigit():
        k = int(parts.pop()[1:])
    if parts and parts[-1] == "naive":
        coef = parts.pop()
    solver = "_".join(parts)
    if solver not in SAMPLERS or (rx and solver not in RX_SOLVERS) or (not rx and (coef != "adapted" or k != 2)):
        raise ConfigError(f"sweep method {name!r} must be [rx_]<solver>[_naive][_k<k>], solver in {sorted(SAMPLERS)}")
    if rx and solver in SINGLESTEP_2ND and k > 2:
        raise ConfigError(f"sweep method {name!r}: RX on {solver!r} supports k <= 2")
    return solver, rx, coef, k


def w2_empirical(a: Tensor, b: Tensor) -> Tensor:
    """Exact W2 between two equal-size empirical measures [n, d] (optimal assignment)."""
    cost = torch.cdist(a.double(), b.double()) ** 2
    r, c = linear_sum_assignment(cost.cpu().numpy())
    return cost[r, c].mean().sqrt()


def mmd_rbf(a: Tensor, b: Tensor, bandwidths: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0)) -> Tensor:
    """Unbiased MMD^2 with a sum of RBF kernels k(x, y) = exp(-|x - y|^2 / (2 h^2)); a [n, d], b [m, d]."""
    a, b = a.double(), b.double()

    def k(x: Tensor, y: Tensor) -> Tensor:
        d2 = torch.cdist(x, y) ** 2
        return sum(torch.exp(-d2 / (2 * h**2)) for h in bandwidths)

    n, m = a.shape[0], b.shape[0]
    kaa, kbb = k(a, a), k(b, b)
    saa = (kaa.sum() - kaa.diagonal().sum()) / (n * (n - 1))
    sbb = (kbb.sum() - kbb.diagonal().sum()) / (m * (m - 1))
    return saa + sbb - 2 * k(a, b).mean()


class DiffusionLitModule(SuiteLitModule):
    """EDM diffusion model + PF-ODE sampling with optional RX-DPM.

    Args:
        net: Raw network F(x, c_noise) (MLPDenoiser / SmallUNet); ``None`` only with ``analytic=true``.
        analytic: Use the exact mixture denoiser of the datamodule (``datamodule.mixture``).
        sigma_data, p_mean, p_std: EDM training constants.
        solver: Base ODE solver: euler | heun | dpm2 | dpmpp_2m.
        rx: Apply RX-DPM extrapolation (euler or dpmpp_2m).
        rx_k: Fine steps per coarse interval.
        rx_coefficients: ``adapted`` (paper) or ``naive`` ((2, -1) for k = 2).
        grid: ``edm`` (Karras rho grid ending at 0) or ``vp_uniform`` / ``vp_logsnr`` (linear-beta VP times).
        n_steps: Grid steps N.
        sigma_min, sigma_max, rho: EDM grid.
        t_min, beta_min, beta_max: VP grid.
        n_eval_samples: Samples generated at test time.
        ref_steps: Steps of the fine reference solve for ``test/ode_err`` (0 disables it).
        lipschitz_sigmas: Noise levels at which the score Lipschitz constant is measured (vector data only).
        fid_feature_steps: Training steps of the FID feature CNN (images only).
        image_scale: Images in [0, 1] are mapped to [-1, 1] when true.
        image_downsample: Average-pool images by this factor (2: Fashion-MNIST 28x28 -> 14x14, to fit a CPU).
        sweep_methods, sweep_nfes: Claim sweep at test time (see the module docstring); both or neither.
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        analytic: bool = False,
        sigma_data: float = 0.5,
        p_mean: float = -1.2,
        p_std: float = 1.2,
        solver: str = "euler",
        rx: bool = False,
        rx_k: int = 2,
        rx_coefficients: str = "adapted",
        grid: str = "edm",
        n_steps: int = 10,
        sigma_min: float = 0.002,
        sigma_max: float = 80.0,
        rho: float = 7.0,
        t_min: float = 1e-3,
        beta_min: float = 0.1,
        beta_max: float = 20.0,
        n_eval_samples: int = 512,
        ref_steps: int = 256,
        lipschitz_sigmas: list[float] | None = None,
        fid_feature_steps: int = 200,
        image_scale: bool = True,
        image_downsample: int = 1,
        sweep_methods: list[str] | None = None,
        sweep_nfes: list[int] | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor)
        if solver not in SAMPLERS:
            raise ConfigError(f"model.solver={solver!r} must be one of {sorted(SAMPLERS)}")
        if rx and solver not in RX_SOLVERS:
            raise ConfigError(f"model.rx=true needs model.solver in {list(RX_SOLVERS)}, got {solver!r}")
        if rx and solver in SINGLESTEP_2ND and rx_k > 2:
            raise ConfigError(f"model.rx_k={rx_k}: RX on {solver!r} supports rx_k <= 2")
        if image_downsample < 1:
            raise ConfigError(f"model.image_downsample={image_downsample} must be >= 1")
        if bool(sweep_methods) != bool(sweep_nfes):
            raise ConfigError("model.sweep_methods and model.sweep_nfes must be given together")
        for m in sweep_methods or []:
            parse_method(m)
        if any(n < 1 for n in sweep_nfes or []):
            raise ConfigError(f"model.sweep_nfes={sweep_nfes} must be >= 1")
        if rx_coefficients not in COEFFICIENTS:
            raise ConfigError(f"model.rx_coefficients={rx_coefficients!r} must be one of {list(COEFFICIENTS)}")
        if grid not in GRIDS:
            raise ConfigError(f"model.grid={grid!r} must be one of {list(GRIDS)}")
        if n_steps < 1 or rx_k < 1 or (rx and n_steps < rx_k):
            raise ConfigError(f"model.n_steps={n_steps} must be >= 1 and >= model.rx_k={rx_k} when rx is on")
        if n_eval_samples < 2:
            raise ConfigError(f"model.n_eval_samples={n_eval_samples} must be >= 2")
        if net is None and not analytic:
            raise ConfigError("model.net is required unless model.analytic=true")
        if any(s <= 0 for s in lipschitz_sigmas or []):
            raise ConfigError(f"model.lipschitz_sigmas={lipschitz_sigmas} must be > 0")
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        sig, _ = self.grid()  # validates sigma_min/sigma_max/rho or the VP constants now, not at test time
        nfe = nfe_of(solver, n_steps, ends_at_zero=float(sig[-1]) == 0.0)
        if nfe < SOLVER_ORDER[solver]:
            raise ConfigError(
                f"model.n_steps={n_steps} gives NFE {nfe}, smaller than the order {SOLVER_ORDER[solver]} of {solver!r}"
            )
        self.precond = EDMPrecond(net, sigma_data) if net is not None else None
        self.mixture: tuple[Tensor, Tensor, Tensor] | None = None
        self.val_loss = torchmetrics.MeanMetric()
        self.ode_err = torchmetrics.MeanMetric()
        self._real: list[Tensor] = []
        self._feat_cache: list[nn.Module] = []  # FID feature CNN of the current test epoch (a list: not a submodule)
        # The exact denoiser has no parameters: nothing to optimise, the training loop only logs its loss.
        self.automatic_optimization = not analytic

    # -- denoiser ------------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.hparams.analytic:
            mix = getattr(dm, "mixture", None)
            if mix is None:
                raise ConfigError(
                    "model.analytic=true needs a datamodule with an exact mixture (GaussianMixtureDataModule)"
                )
            self.mixture = mix

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        """D(x [B, ...], sigma [B]) -> [B, ...]: the network, or the exact mixture posterior mean."""
        if self.hparams.analytic:
            return gmm_denoiser(x.double(), sigma.double(), *self.mixture).to(x.dtype)
        return self.precond(x, sigma)

    @staticmethod
    def _data(batch: Any) -> Tensor:
        return batch[0] if isinstance(batch, (list, tuple)) else batch

    def _prep(self, batch: Any) -> Tensor:
        x = self._data(batch).float()
        if x.ndim == 4 and self.hparams.get("image_downsample", 1) > 1:
            x = nn.functional.avg_pool2d(x, self.hparams.image_downsample)
        return x * 2 - 1 if x.ndim == 4 and self.hparams.image_scale else x

    def edm_loss(self, x: Tensor) -> Tensor:
        """E_sigma E_n lambda(sigma) |D(x + n, sigma) - x|^2 with ln sigma ~ N(P_mean, P_std^2)."""
        sigma = torch.exp(self.hparams.p_mean + self.hparams.p_std * torch.randn(x.shape[0], device=x.device))
        y = x + sigma.view(-1, *([1] * (x.ndim - 1))) * torch.randn_like(x)
        err = (self.denoise(y, sigma) - x).flatten(1).pow(2).mean(1)
        weight = self.precond.loss_weight(sigma) if self.precond is not None else torch.ones_like(sigma)
        return (weight * err).mean()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        loss = self.edm_loss(self._prep(batch))
        self.log("train/loss", loss, prog_bar=True)
        return None if self.hparams.analytic else loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        # seeded noise levels and noise (core.rng): a smooth sizing curve, runs scored on the same draws, and the
        # training stream continues as if no validation had run
        with fixed_draws(batch_idx, self.device):
            loss = self.edm_loss(self._prep(batch))
        self.val_loss.update(loss)
        self.log("val/loss", self.val_loss, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        return None if self.hparams.analytic else super().configure_optimizers()

    # -- sampling ------------------------------------------------------------------------------------------------
    def grid(self, n_steps: int | None = None) -> tuple[Tensor, float]:
        """(sigma~ grid [N+1], alpha at the last point) for the configured grid."""
        h, n = self.hparams, n_steps or self.hparams.n_steps
        if h.grid == "edm":
            return karras_sigmas(n, h.sigma_min, h.sigma_max, h.rho), 1.0
        t = vp_time_grid(n, 1.0, h.t_min, "uniform" if h.grid == "vp_uniform" else "logsnr", h.beta_min, h.beta_max)
        sig, alpha = vp_sigmas(t, h.beta_min, h.beta_max)
        return sig, float(alpha[-1])

    def prior(self, n: int, shape: tuple[int, ...], generator: torch.Generator | None = None) -> Tensor:
        """x~_T: N(0, sigma_max^2 I) (EDM) or x_T / alpha_T with x_T ~ N(0, I) (VP)."""
        sig, _ = self.grid()
        if self.hparams.grid == "edm":
            scale = float(sig[0])
        else:
            scale = 1.0 / float(vp_alpha_sigma(torch.tensor(1.0), self.hparams.beta_min, self.hparams.beta_max)[0])
        return scale * torch.randn(n, *shape, generator=generator).to(self.device)

    @torch.no_grad()
    def generate(
        self,
        x_t: Tensor,
        n_steps: int | None = None,
        solver: str | None = None,
        rx: bool | None = None,
        coefficients: str | None = None,
        k: int | None = None,
    ):
        """Run the configured sampler (or the given one) from x~_T; returns (samples [B, ...], nfe)."""
        h = self.hparams
        sig, alpha_end = self.grid(n_steps)
        solver, rx = solver or h.solver, h.rx if rx is None else rx
        if rx:
            out = rx_sample(self.denoise, x_t, sig, solver, k or h.rx_k, coefficients or h.rx_coefficients)
        else:
            out = sample(self.denoise, x_t, sig, solver)
        return alpha_end * out.x, out.nfe

    @torch.no_grad()
    def x0_quality_curve(self, batch: Any) -> dict[str, Tensor]:
        """Per-step x0 quality for :class:`callbacks.x0_quality.X0QualityCurve`: the mean squared distance of each
        denoiser call's x0-prediction (step 0: x0 = 0) to the final sample, from noise shaped like the batch."""
        real = self._prep(batch)
        x_t = self.prior(real.shape[0], tuple(real.shape[1:]), torch.Generator().manual_seed(0)).to(real.dtype)
        den, calls = recording(self.denoise)
        h = self.hparams
        sig, alpha_end = self.grid()
        out = rx_sample(den, x_t, sig, h.solver, h.rx_k, h.rx_coefficients) if h.rx else sample(den, x_t, sig, h.solver)
        final = alpha_end * out.x
        preds = [torch.zeros_like(final)] + [d for _, d in calls]
        return {"mse_to_final": torch.stack([(p - final).pow(2).mean().double() for p in preds])}

    # -- test ----------------------------------------------------------------------------------------------------
    def on_test_epoch_start(self) -> None:
        self._real = []

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._real.append(self._prep(batch).detach())

    def on_test_epoch_end(self) -> None:
        real = torch.cat(self._real)[: self.hparams.n_eval_samples]
        n = real.shape[0]
        if n < 2:
            raise ConfigError("the test split needs at least 2 samples")
        gen = torch.Generator().manual_seed(1234)
        x_t = self.prior(n, tuple(real.shape[1:]), gen).to(real.dtype)
        fake, nfe = self.generate(x_t)
        self.log("test/nfe", float(nfe))
        if self.hparams.ref_steps > 0 and real.ndim == 2:
            ref, _ = self.generate(x_t, n_steps=self.hparams.ref_steps, solver="dpm2", rx=False)
            self.ode_err.update((fake - ref).norm(dim=1))
            self.log("test/ode_err", self.ode_err)
        self._feat_cache.clear()
        if real.ndim == 2:
            self.log("test/w2", w2_empirical(fake, real).float())
            self.log("test/mmd", mmd_rbf(fake, real).float())
            self._lipschitz(real)
        else:
            self.log("test/fid", self._fid(fake, real))
        if self.hparams.get("sweep_methods"):
            self._sweep(x_t, real)

    def _sweep(self, x_t: Tensor, real: Tensor) -> None:
        """Every sweep method at every NFE budget from the same noise x_t (see the module docstring)."""
        h = self.hparams
        ends_at_zero = float(self.grid(4)[0][-1]) == 0.0
        ref = None
        if real.ndim == 2:
            ref, _ = self.generate(x_t, n_steps=max(h.ref_steps, 2), solver="dpm2", rx=False)
            if self.mixture is not None:
                sig, alpha_end = self.grid(max(h.ref_steps, 2))
                w, mu, cov = self.mixture
                sp = reference_solve(
                    lambda x, s: gmm_score(x, s, w, mu, cov),
                    x_t[:4].double(),
                    float(sig[0]),
                    float(sig[-1]),
                    1e-10,
                    1e-10,
                )
                self.log("test/ref_gap_scipy", float((alpha_end * sp - ref[:4].double()).norm(dim=1).max()))
        for name in h.sweep_methods:
            solver, rx, coef, k = parse_method(name)
            for budget in h.sweep_nfes:
                try:
                    n = steps_for_nfe(solver, budget, ends_at_zero)
                    if rx and n < k * (2 if solver == "dpmpp_2m" else 1):
                        continue  # budget too small for one RX interval
                except ConfigError:
                    continue
                fake, nfe = self.generate(x_t, n_steps=n, solver=solver, rx=rx, coefficients=coef, k=k)
                key = f"test/sweep/{name}/nfe{budget}"
                self.log(f"{key}/nfe", float(nfe))
                if ref is not None:
                    self.log(f"{key}/ode_err", (fake - ref).norm(dim=1).mean().float())
                    self.log(f"{key}/w2", w2_empirical(fake, real).float())
                else:
                    self.log(f"{key}/fid", self._fid(fake, real))

    def _lipschitz(self, real: Tensor) -> None:
        pts = real[:64].double()
        for i, s in enumerate(self.hparams.lipschitz_sigmas or []):
            with torch.inference_mode(False), torch.enable_grad():
                jac = score_jacobian(lambda x, sig: self.denoise(x.to(real.dtype), sig).double(), pts, s)
            self.log(f"test/lip_learned_{i}", spectral_norm_sym(jac).max().float())
            if self.mixture is not None or getattr(self.trainer.datamodule, "mixture", None) is not None:
                mix = self.mixture or self.trainer.datamodule.mixture
                self.log(f"test/lip_exact_{i}", spectral_norm_sym(gmm_hessian(pts, s, *mix)).max().float())

    def _fid(self, fake: Tensor, real: Tensor) -> Tensor:
        from torchmetrics.image.fid import FrechetInceptionDistance

        dm = self.trainer.datamodule

        def batches():
            for b in dm.train_dataloader():
                yield self._prep(b).to(real.device), b[1].to(real.device)

        # Lightning tests under inference_mode; the feature CNN is trained here (once per test epoch), so leave it.
        feat = self._feat_cache[0] if self._feat_cache else None
        if feat is None:
            with torch.inference_mode(False), torch.enable_grad():
                torch.manual_seed(0)
                feat = FeatureNet(in_channels=real.shape[1]).to(real.device)
                train_feature_net(feat, batches, self.hparams.fid_feature_steps)
            feat.eval()
            self._feat_cache.append(feat)
        with torch.inference_mode(False):
            fid = FrechetInceptionDistance(feature=feat, normalize=True).to(real.device)
            fid.update(real.clone().clamp(-1, 1), real=True)
            fid.update(fake.clone().clamp(-1, 1), real=False)
            return fid.compute().float()
