"""Molecular graphs with ZINC's vocabularies and target: ZINC-12k (real) or MOSES molecules (embedded).

* ``source=real``: :class:`torch_geometric.datasets.ZINC` with ``subset=True`` (the 12k graphs of Dwivedi et al.'s
  benchmark, 10k/1k/1k). It reads ``<data_dir>/raw/{train,val,test}.pickle`` and ``{train,val,test}.index`` and
  downloads them when missing and a network exists.
* ``source=embedded`` (default, no network): SMILES from the MOSES files shipped in the ``molsets`` wheel (a
  filtered subset of ZINC Clean Leads; ``moses/dataset/data/<moses_file>.csv.gz``, read without importing ``moses``),
  ``num_molecules`` sampled with ``split_seed`` and split 10k/1k/1k. Each molecule is kekulised by RDKit and
  turned into a graph with ZINC's atom vocabulary (28 tokens such as ``C``, ``O``, ``N H1 +``) and bond vocabulary
  (``SINGLE=1, DOUBLE=2, TRIPLE=3``). The target is ZINC's ``logP_SA_cycle_normalized``: penalised logP =
  Crippen logP - SA score (RDKit Contrib ``SA_Score``) - ring penalty ``max(0, largest ring - 6)``, each term
  standardised with the ZINC-250k statistics of JT-VAE (Jin et al., 2018), which is how ZINC-12k's ``y`` was made;
  ``target_normalization=none`` gives the raw sum instead.

Graphs are featurised lazily on first access (so a ``fast_dev_run`` touches only a few hundred molecules) and the
whole set is written to ``<data_dir>/moses_<file>_<n>_seed<split_seed>_<target>.pt`` once every molecule has been
built; later runs load that cache (tensors only, ``weights_only=True``).

Graphs: ``x`` ``[N, 1]`` atom ids, ``edge_index`` ``[2, E]`` (both directions), ``edge_attr`` ``[E]`` bond ids,
``y`` ``[1]``.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info
from torch_geometric.data import Batch, Data

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, seeded_permutation, world

# Atom vocabulary of ZINC (benchmarking-gnns' atom_dict): symbol, explicit H count and charge of bracket atoms.
ZINC_ATOMS: tuple[str, ...] = (
    "C",
    "O",
    "N",
    "F",
    "C H1",
    "S",
    "Cl",
    "O -",
    "N H1 +",
    "Br",
    "N H3 +",
    "N H2 +",
    "N +",
    "N -",
    "S -",
    "I",
    "P",
    "O H1 +",
    "N H1 -",
    "O +",
    "S +",
    "P H1",
    "P H2",
    "C H2 -",
    "P +",
    "S H1 +",
    "C H1 -",
    "P H1 +",
)
ATOM_IDS = {tok: i for i, tok in enumerate(ZINC_ATOMS)}
ZINC_BONDS = {"SINGLE": 1, "DOUBLE": 2, "TRIPLE": 3}
# JT-VAE's ZINC-250k statistics of logP, -SA and -ring penalty (used for ZINC's logP_SA_cycle_normalized).
LOGP_MEAN, LOGP_STD = 2.4570953396190123, 1.434324401111988
SA_MEAN, SA_STD = -3.0525811293166134, 0.8335207024513095
CYCLE_MEAN, CYCLE_STD = -0.0485696876403053, 0.2860212110245455
TARGETS = ("zinc250k", "none")
MOSES_FILES = ("train", "test", "test_scaffolds")
ZINC_RAW = ["train.pickle", "val.pickle", "test.pickle", "train.index", "val.index", "test.index"]
HOW_TO_GET_ZINC = (
    "Run once with a network (torch_geometric.datasets.ZINC downloads them), or copy the raw files of the "
    "benchmarking-gnns ZINC molecules.zip (train/val/test.pickle) and its train/val/test.index into <data_dir>/raw."
)
CACHE_VERSION = 1


def atom_token(atom: Any) -> str:
    """ZINC token of an RDKit atom: the symbol, then ``H<n>`` and the charge sign for charged or chiral atoms."""
    token = atom.GetSymbol()
    charge = atom.GetFormalCharge()
    chiral = str(atom.GetChiralTag()) != "CHI_UNSPECIFIED"
    if charge or chiral:
        hs = atom.GetTotalNumHs()
        if hs:
            token += f" H{hs}"
        if charge:
            token += " +" if charge > 0 else " -"
    return token


def penalized_logp(mol: Any, normalization: str = "zinc250k") -> float:
    """ZINC's target: logP - SA - max(0, largest ring - 6), each term standardised (``zinc250k``) or raw."""
    from rdkit.Chem import Crippen
    from rdkit.Contrib.SA_Score import sascorer

    logp = Crippen.MolLogP(mol)
    sa = -sascorer.calculateScore(mol)
    largest = max((len(r) for r in mol.GetRingInfo().AtomRings()), default=0)
    cycle = -max(largest - 6, 0)
    if normalization == "none":
        return logp + sa + cycle
    return (logp - LOGP_MEAN) / LOGP_STD + (sa - SA_MEAN) / SA_STD + (cycle - CYCLE_MEAN) / CYCLE_STD


def smiles_to_graph(smiles: str, normalization: str = "zinc250k", where: str = "<smiles>") -> Data:
    """One molecule as a ZINC-style graph (kekulised bonds, ZINC atom ids, penalised-logP target).

    Raises:
        DataFormatError: unparsable SMILES or an atom/bond outside ZINC's vocabulary (names ``where``).
    """
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        raise DataFormatError(f"{where}: SMILES {smiles!r} does not parse to a molecule")
    y = penalized_logp(mol, normalization)
    Chem.Kekulize(mol, clearAromaticFlags=True)
    ids = []
    for atom in mol.GetAtoms():
        tok = atom_token(atom)
        if tok not in ATOM_IDS:
            raise DataFormatError(f"{where}: atom {tok!r} of {smiles!r} is not in ZINC's atom vocabulary")
        ids.append(ATOM_IDS[tok])
    rows, types = [], []
    for bond in mol.GetBonds():
        name = str(bond.GetBondType())
        if name not in ZINC_BONDS:
            raise DataFormatError(f"{where}: bond type {name} of {smiles!r} is not in ZINC's bond vocabulary")
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        rows += [(i, j), (j, i)]
        types += [ZINC_BONDS[name]] * 2
    edge_index = torch.tensor(rows, dtype=torch.long).t().reshape(2, -1)
    order = (edge_index[0] * len(ids) + edge_index[1]).argsort()
    return Data(
        x=torch.tensor(ids, dtype=torch.long).view(-1, 1),
        edge_index=edge_index[:, order].contiguous(),
        edge_attr=torch.tensor(types, dtype=torch.long)[order],
        y=torch.tensor([y], dtype=torch.float),
    )


def moses_csv(name: str) -> Path:
    """Path of a MOSES split shipped in the ``molsets`` wheel (found without importing ``moses``)."""
    spec = importlib.util.find_spec("moses")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            "the embedded molecules need the MOSES files of `molsets`: `pip install --no-deps molsets==0.3.1` "
            "(its own dependencies do not build on Python 3.11 and are not needed)"
        )
    path = Path(spec.submodule_search_locations[0]) / "dataset" / "data" / f"{name}.csv.gz"
    if not path.is_file():
        raise MissingDataError(f"missing data file: {path} (reinstall molsets==0.3.1)")
    return path


def read_smiles(path: Path) -> list[str]:
    """SMILES column of a MOSES ``.csv.gz`` (header ``SMILES``, optionally ``SPLIT``)."""
    with gzip.open(path, "rt") as f:
        header = f.readline().strip().split(",")
        if "SMILES" not in header:
            raise DataFormatError(f"{path}: row 1 (header) {header} has no SMILES column")
        col = header.index("SMILES")
        return [line.rstrip("\n").split(",")[col] for line in f if line.strip()]


class MoleculeStore:
    """Featurises the molecules of ``smiles`` on first access; saves every graph to ``cache`` once all are built."""

    def __init__(self, smiles: Sequence[str], normalization: str, cache: Path | None, source: str) -> None:
        self.smiles, self.normalization, self.cache, self.source = list(smiles), normalization, cache, source
        self.graphs: dict[int, Data] = {}

    def __len__(self) -> int:
        return len(self.smiles)

    def get(self, i: int) -> Data:
        if i not in self.graphs:
            where = f"{self.source} (sampled molecule {i})"
            self.graphs[i] = smiles_to_graph(self.smiles[i], self.normalization, where)
            complete = len(self.graphs) == len(self.smiles)
            if complete and self.cache is not None and get_worker_info() is None and world()[0] == 0:
                save_graphs(self.cache, [self.graphs[j] for j in range(len(self.smiles))], self.smiles)
        return self.graphs[i]

    @classmethod
    def from_cache(cls, path: Path) -> MoleculeStore:
        smiles, graphs = load_graphs(path)
        store = cls(smiles, "", None, str(path))
        store.graphs = dict(enumerate(graphs))
        return store


def save_graphs(path: Path, graphs: Sequence[Data], smiles: Sequence[str]) -> None:
    """Write graphs as concatenated tensors + offsets (atomic rename; loadable with ``weights_only=True``)."""
    state = {
        "version": CACHE_VERSION,
        "smiles": list(smiles),
        "x": torch.cat([g.x.view(-1) for g in graphs]),
        "edge_index": torch.cat([g.edge_index for g in graphs], 1),
        "edge_attr": torch.cat([g.edge_attr for g in graphs]),
        "y": torch.cat([g.y.view(-1) for g in graphs]),
        "num_nodes": torch.tensor([g.num_nodes for g in graphs]),
        "num_edges": torch.tensor([g.edge_index.shape[1] for g in graphs]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_graphs(path: Path) -> tuple[list[str], list[Data]]:
    """Inverse of :func:`save_graphs`."""
    try:
        s = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable cache gets the same message
        raise DataFormatError(
            f"{path}: unreadable molecule cache ({type(err).__name__}); delete it to rebuild"
        ) from None
    if not isinstance(s, dict) or s.get("version") != CACHE_VERSION:
        raise DataFormatError(f"{path}: not a version-{CACHE_VERSION} molecule cache; delete it to rebuild")
    nodes, edges = s["num_nodes"].tolist(), s["num_edges"].tolist()
    xs, eis, eas = s["x"].split(nodes), s["edge_index"].split(edges, 1), s["edge_attr"].split(edges)
    graphs = [
        Data(x=x.view(-1, 1), edge_index=ei, edge_attr=ea, y=s["y"][i : i + 1])
        for i, (x, ei, ea) in enumerate(zip(xs, eis, eas))
    ]
    return s["smiles"], graphs


class MoleculeSplit(Dataset):
    """A split: indices into a :class:`MoleculeStore`."""

    def __init__(self, store: MoleculeStore, indices: Sequence[int]) -> None:
        self.store, self.indices = store, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Data:
        return self.store.get(self.indices[i])


def collate_graphs(items: list[Data]) -> Batch:
    """PyG batching (block-diagonal ``edge_index``, ``batch`` vector)."""
    return Batch.from_data_list(items)


class MoleculesDataModule(SuiteDataModule):
    """ZINC-12k (``real``) or MOSES molecules with ZINC's vocabularies and target (``embedded``).

    Args:
        source, data_dir, batch_size, num_workers, seed: See :class:`SuiteDataModule` (``seed`` shuffles batches).
        num_molecules: Embedded molecules sampled from the MOSES file (the splits' total).
        split_sizes: Train/val/test sizes of the embedded set (sum <= ``num_molecules``).
        split_seed: Seed of the embedded sample and split (fixed across training seeds).
        moses_file: MOSES file to sample from: ``train`` (1.58M SMILES), ``test`` (176k) or ``test_scaffolds``.
        target_normalization: ``zinc250k`` (ZINC's normalised penalised logP) or ``none`` (raw).
        limit: Keep only the first ``limit`` graphs of each split (quick runs), ``None`` for all.
        cache: Write/read the featurised embedded set under ``data_dir``.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data/molecules",
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        num_molecules: int = 12000,
        split_sizes: Sequence[int] = (10000, 1000, 1000),
        split_seed: int = 0,
        moses_file: str = "test",
        target_normalization: str = "zinc250k",
        limit: int | None = None,
        cache: bool = True,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        split_sizes = [int(s) for s in split_sizes]
        if len(split_sizes) != 3 or min(split_sizes) < 1:
            raise ConfigError(f"data.split_sizes={split_sizes} must be three sizes >= 1 (train, val, test)")
        if sum(split_sizes) > num_molecules:
            raise ConfigError(f"data.split_sizes={split_sizes} must sum to <= data.num_molecules={num_molecules}")
        if moses_file not in MOSES_FILES:
            raise ConfigError(f"data.moses_file={moses_file!r} must be one of {list(MOSES_FILES)}")
        if target_normalization not in TARGETS:
            raise ConfigError(f"data.target_normalization={target_normalization!r} must be one of {list(TARGETS)}")
        if limit is not None and limit < 1:
            raise ConfigError(f"data.limit={limit} must be >= 1 or null")
        self.num_molecules, self.split_sizes, self.split_seed = num_molecules, split_sizes, split_seed
        self.moses_file, self.target_normalization, self.limit, self.cache = (
            moses_file,
            target_normalization,
            limit,
            cache,
        )

    @property
    def cache_path(self) -> Path:
        name = f"moses_{self.moses_file}_{self.num_molecules}_seed{self.split_seed}_{self.target_normalization}.pt"
        return Path(self.data_dir) / name

    def _limited(self, splits: dict[str, Any]) -> dict[str, Any]:
        if self.limit is None:
            return splits
        return {k: torch.utils.data.Subset(v, range(min(self.limit, len(v)))) for k, v in splits.items()}

    def load_embedded(self) -> dict[str, Any]:
        if self.cache and self.cache_path.is_file():
            store = MoleculeStore.from_cache(self.cache_path)
        else:
            path = moses_csv(self.moses_file)
            smiles = read_smiles(path)
            if len(smiles) < self.num_molecules:
                raise ConfigError(f"data.num_molecules={self.num_molecules} exceeds the {len(smiles)} SMILES of {path}")
            chosen = seeded_permutation(len(smiles), self.split_seed)[: self.num_molecules].tolist()
            store = MoleculeStore(
                [smiles[i] for i in chosen],
                self.target_normalization,
                self.cache_path if self.cache else None,
                str(path),
            )
        n_train, n_val, n_test = self.split_sizes
        splits = {
            "train": MoleculeSplit(store, range(n_train)),
            "val": MoleculeSplit(store, range(n_train, n_train + n_val)),
            "test": MoleculeSplit(store, range(n_train + n_val, n_train + n_val + n_test)),
        }
        return self._limited(splits)

    def load_real(self) -> dict[str, Any]:
        from torch_geometric.datasets import ZINC

        root = Path(self.data_dir)
        processed = root / "subset" / "processed"
        have_processed = all((processed / f"{s}.pt").is_file() for s in ("train", "val", "test"))
        have_raw = all((root / "raw" / f).is_file() for f in ZINC_RAW)
        try:
            return self._limited({s: ZINC(str(root), subset=True, split=s) for s in ("train", "val", "test")})
        except (OSError, pickle.UnpicklingError, KeyError, ValueError, RuntimeError) as err:
            if not (have_processed or have_raw):
                missing = [str(root / "raw" / f) for f in ZINC_RAW if not (root / "raw" / f).is_file()]
                raise MissingDataError(
                    f"ZINC download failed ({type(err).__name__}); missing data file(s): {', '.join(missing)}. "
                    f"{HOW_TO_GET_ZINC}"
                ) from None
            raise DataFormatError(
                f"{root / 'raw'}: ZINC raw files could not be processed ({type(err).__name__}: {err})"
            ) from None

    def loader(self, split: str, shuffle: bool | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("collate_fn", collate_graphs)
        return super().loader(split, shuffle, **kwargs)
