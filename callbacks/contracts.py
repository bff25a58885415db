"""What each shared callback needs from a LightningModule and its LightningDataModule: the opt-in contracts.

A paper's module opts in to a shared callback by meeting that callback's contract; there is no registration and the
callback never imports the module. Each contract lives here once:

* the typed protocols (:class:`Classifier`, :class:`MultimodalTTA`, :class:`DynamicsData`, :class:`CausalLMNet`,
  :class:`MaskedLMNet`) name what the objects must expose; the checks read those names from the protocols
  (:func:`protocol_members`, :func:`missing_members`, ``isinstance`` on the runtime-checkable ones);
* a pure check per callback, ``<callback>_problems(module, datamodule) -> list[str]`` (empty: the pair meets it),
  that needs no Trainer. The callbacks run it at ``setup`` (their ``contract_problems``) and refuse a pair that
  fails with one :class:`~core.errors.ConfigError` line naming what is missing;
* :data:`CONTRACTS`, one :class:`Contract` per callback: its check and the one-line summary of what the module and
  the datamodule provide. :func:`contract_table` renders them as the table of ``docs/extending.md``
  (``tests/callbacks/test_contract_table.py`` fails when that table, or the README's list of callbacks with a
  contract, disagrees with :data:`CONTRACTS`).

``tests/callbacks/test_callback_registry.py`` runs the checks over every ``conf/experiment/*.yaml`` to find, and
then train, the pairs each callback works with. The data checks look at one small batch (two examples of the split's
dataset, collated by its loader); the module checks run one forward pass on it in eval mode, without gradients and
without consuming the global random state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Dataset, IterableDataset

from core.errors import ConfigError
from datamodules._base import ResumableSampler  # the suite's rank-sharded sequential sampler

NORM_TYPES = (nn.LayerNorm, _BatchNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)


# -- the protocols ---------------------------------------------------------------------------------------------------
@runtime_checkable
class Classifier(Protocol):
    """A classification module: ``num_classes`` and ``module(x) -> logits [B, num_classes]`` (``x`` a tensor or a
    tuple of modalities, whatever the datamodule's batches carry first)."""

    num_classes: int

    def __call__(self, x: Any) -> torch.Tensor: ...


@runtime_checkable
class MultimodalTTA(Protocol):
    """SuMi's extra need: ``tta_forward(x)`` gives the fused and per-modality logits (``SumiLitModule``)."""

    def tta_forward(self, x: Any) -> Any: ...


@runtime_checkable
class DynamicsData(Protocol):
    """A datamodule that names the rows loss dynamics are recorded on: the un-augmented training set in a fixed
    order, batches ``(x, y, index)`` with ``index`` the row in ``[0, N)`` (e.g. ``PoisonedDataModule``)."""

    def dynamics_dataloader(self) -> DataLoader: ...


@runtime_checkable
class CausalLMNet(Protocol):
    """The causal LM shape :class:`layers.quant.ostquant.TransformedLM` rewrites (:class:`layers.lm.CausalLM`):
    token embedding, pre-norm blocks (``norm1``/``mixer``, ``norm2``/``mlp``, each with linear layers), final norm,
    LM head; ``net(input_ids) -> logits [B, T, V]``."""

    embed: nn.Module
    blocks: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Module


@runtime_checkable
class MaskedLMNet(Protocol):
    """The masked LM shape :class:`layers.quant.minilm.QuantMiniLM` rewrites: a BERT ``encoder`` (``embeddings`` +
    ``encoder.layer``) and an MLM ``head``; ``net(input_ids, mask) -> logits [N, V]`` at the masked positions."""

    encoder: nn.Module
    head: nn.Module


def protocol_members(proto: type) -> tuple[str, ...]:
    """The attributes (annotated) and then the methods a protocol declares itself, in declaration order (dunder
    methods such as ``__call__`` left out: :func:`has_forward` and the probes check those)."""
    names = list(vars(proto).get("__annotations__", {}))
    names += [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_") and n not in names]
    return tuple(names)


def missing_members(obj: Any, proto: type) -> list[str]:
    """The members of ``proto`` (:func:`protocol_members`) that ``obj`` does not have."""
    return [n for n in protocol_members(proto) if not hasattr(obj, n)]


CAUSAL_LM_PARTS = protocol_members(CausalLMNet)


# -- shared helpers --------------------------------------------------------------------------------------------------
def norm_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of the affine weight and bias of every normalisation layer of ``module``."""
    out = []
    for name, m in module.named_modules():
        if isinstance(m, NORM_TYPES):
            for pname, p in m.named_parameters(recurse=False):
                if pname in ("weight", "bias"):
                    out.append((f"{name}.{pname}" if name else pname, p))
    return out


def layout(batch: Any) -> str:
    """A short description of a batch's structure (``(x, y)``, ``dicts with keys [...]``, ``tensors [B, T]``)."""
    if isinstance(batch, torch.Tensor):
        return f"tensors {list(batch.shape)}"
    if isinstance(batch, dict):
        return f"dicts with keys {sorted(map(str, batch))}"
    if isinstance(batch, (list, tuple)):
        names = ("x", "y", "index")
        return "(" + ", ".join(names[i] if i < len(names) else f"b{i}" for i in range(len(batch))) + ")"
    return type(batch).__name__


def _map_style(ds: Any) -> bool:
    return not isinstance(ds, IterableDataset) and hasattr(ds, "__getitem__") and hasattr(ds, "__len__")


def _collate(loader: DataLoader, items: list[Any]) -> Any:
    collate = getattr(loader, "collate_fn", None)
    return collate(items) if collate is not None else torch.utils.data.default_collate(items)


def first_loader(loaders: Any) -> DataLoader:
    """The first loader of what a ``*_dataloader()`` returned (a loader, or a list / dict of loaders)."""
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        if not loaders:
            raise ConfigError("it returns no loader")
        return loaders[0]
    return loaders


def small_batch(loader: DataLoader, n: int = 2) -> Any:
    """The first ``n`` examples of ``loader``'s dataset, collated as the loader does (its first batch for an
    iterable dataset)."""
    ds = loader.dataset
    if _map_style(ds) and len(ds) > 0:
        return _collate(loader, [ds[i] for i in range(min(n, len(ds)))])
    return next(iter(loader))


def sample_batch(datamodule: Any, split: str, n: int = 2) -> tuple[Any, str | None]:
    """``(batch, None)``: ``n`` examples of ``datamodule``'s ``split`` (``train``/``val``/``test``) as its loader
    collates them; ``(None, why)`` when the datamodule cannot give one."""
    get = getattr(datamodule, f"{split}_dataloader", None)
    if not callable(get):
        return None, f"has no {split}_dataloader()"
    try:
        return small_batch(first_loader(get()), n), None
    except (StopIteration, NotImplementedError):
        return None, f"gives no {split} batch"
    except Exception as err:  # noqa: BLE001 - any failure is reported as what the contract lacks
        return None, f"cannot give a {split} batch ({type(err).__name__}: {' '.join(str(err).split())[:120]})"


def has_forward(module: nn.Module) -> bool:
    """Whether ``module``'s class defines ``forward`` (``LightningModule``'s own raises ``NotImplementedError``)."""
    owner = next(c for c in type(module).__mro__ if "forward" in vars(c))
    return owner not in (nn.Module, LightningModule)


def probe_forward(module: nn.Module, x: Any) -> Any:
    """``module(x)`` in eval mode without gradients, leaving every submodule's mode and the random state as found."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        device = next(module.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    module.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            return module(move_data_to_device(x, device))
    finally:
        for m, mode in modes:
            m.training = mode


def labelled(batch: Any) -> bool:
    """Whether ``batch`` is ``(x, y, ...)`` with integer class labels ``y [B]``."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return False
    y = batch[1]
    return isinstance(y, torch.Tensor) and y.dim() == 1 and not y.is_floating_point() and y.dtype != torch.bool


def _labels_shown(batch: Any, drop_last: bool = False) -> str:
    """``layout(batch)``, plus what ``y`` is when it is not class labels (``(x, y) with y float32 [64, 6]``)."""
    if isinstance(batch, (list, tuple)) and drop_last:
        batch = batch[:-1]
    shown = layout(batch)
    if isinstance(batch, (list, tuple)) and len(batch) >= 2 and isinstance(batch[1], torch.Tensor):
        y = batch[1]
        if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool:
            shown += f" with y {str(y.dtype).removeprefix('torch.')} {list(y.shape)}"
    return shown


def logit_problem(module: nn.Module, x: Any, n_classes: int | None) -> tuple[str | None, int]:
    """``(why module(x) is not logits [B, C] or None, C)`` for a probe batch ``x``."""
    name = type(module).__name__
    try:
        out = probe_forward(module, x)
    except Exception as err:  # noqa: BLE001 - the contract's forward failed on the data: say how
        why = " ".join(str(err).split())[:120]
        return f"model {name}(x) fails on the datamodule's x ({type(err).__name__}: {why})", 0
    b = len(x[0]) if isinstance(x, (list, tuple)) else len(x)
    shape_ok = isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == b and out.shape[1] >= 2
    if not shape_ok or (n_classes is not None and out.shape[1] != n_classes):
        got = layout(out) if not isinstance(out, torch.Tensor) else f"a tensor {list(out.shape)}"
        return f"model {name}(x) returns {got}, needs logits [B, {n_classes or 'C'}]", 0
    return None, int(out.shape[1])


# -- TestTimeAdaptation ----------------------------------------------------------------------------------------------
def tta_problems(
    module: nn.Module,
    datamodule: Any = None,
    *,
    params: str = "norm",
    tta_forward: bool = False,
    num_classes: int | None = None,
    probe: bool = True,
) -> list[str]:
    """What ``module`` / ``datamodule`` lack for :class:`callbacks.tta.TestTimeAdaptation` (empty: nothing).

    Args:
        module: The LightningModule (a :class:`Classifier`).
        datamodule: Its datamodule, or ``None`` to check the module alone.
        params: The callback's ``params`` (``norm`` needs normalisation layers).
        tta_forward: The strategy needs ``module.tta_forward`` (:class:`MultimodalTTA`, SuMi).
        num_classes: The callback's ``num_classes`` (``None``: ``module.num_classes``).
        probe: Check ``module(x)`` on a test batch gives logits ``[B, C]``.
    """
    name = type(module).__name__
    problems = []
    (attr,) = protocol_members(Classifier)
    c = num_classes or getattr(module, attr, None)
    if not isinstance(c, int) or isinstance(c, bool) or c < 2:
        problems.append(f"model {name} has no integer {attr} >= 2 (or set callbacks.tta.{attr})")
        c = None
    if not has_forward(module):
        problems.append(f"model {name} has no forward(x) -> logits [B, C]")
    if params == "norm" and not norm_parameters(module):
        problems.append(
            f"model {name} has no normalisation layers (needs LayerNorm/BatchNorm/GroupNorm/InstanceNorm to adapt, "
            "or callbacks.tta.params=all)"
        )
    if tta_forward and not isinstance(module, MultimodalTTA):
        (meth,) = protocol_members(MultimodalTTA)
        problems.append(f"model {name} has no {meth}(x): method='sumi' needs a multimodal module with {meth}")
    if datamodule is None:
        return problems
    dname = type(datamodule).__name__
    batch, why = sample_batch(datamodule, "test")
    if why:
        problems.append(f"datamodule {dname} {why}")
    elif not labelled(batch):
        shown = _labels_shown(batch)
        problems.append(f"datamodule {dname} test batches are {shown}, needs (x, y, ...) with class labels y [B]")
    elif probe and not problems:
        problem, _ = logit_problem(module, batch[0], c)
        if problem:
            problems.append(problem)
    return problems


# -- LossDynamics ----------------------------------------------------------------------------------------------------
class WithIndex(Dataset):
    """Items ``(x, y)`` of ``dataset`` as ``(x, y, i)``: the row of a training split that names no index of its own."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return (*self.dataset[i], i)


class _AppendIndex:
    """Collate ``(x, y, i)`` items with the datamodule's own collate function for ``(x, y)``, then append ``i``."""

    def __init__(self, collate: Callable[[list[Any]], Any] | None) -> None:
        self.collate = collate or torch.utils.data.default_collate

    def __call__(self, items: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        batch = self.collate([item[:-1] for item in items])
        return (*batch, torch.tensor([item[-1] for item in items], dtype=torch.long))


def dynamics_loader(datamodule: Any) -> DataLoader:
    """The loader :class:`callbacks.loss_dynamics.LossDynamics` scores: ``datamodule.dynamics_dataloader()``
    (:class:`DynamicsData`), else the ``train`` split in a fixed order (rank-sharded, the datamodule's batch size and
    collate function), items ``(x, y, index)`` as they are and items ``(x, y)`` with their row appended as the index.
    Raises :class:`ConfigError` when neither exists."""
    if isinstance(datamodule, DynamicsData):
        return datamodule.dynamics_dataloader()
    name = type(datamodule).__name__
    get = getattr(datamodule, "train_dataloader", None)
    if datamodule is None or not callable(get):
        raise ConfigError(f"datamodule {name} has neither dynamics_dataloader() nor train_dataloader()")
    base = first_loader(get())
    if not _map_style(base.dataset):
        raise ConfigError(
            f"datamodule {name} streams its training set (an iterable dataset) and has no dynamics_dataloader(): "
            "loss dynamics need fixed rows (x, y, index)"
        )

    ds, collate = base.dataset, getattr(base, "collate_fn", None)
    first = ds[0] if len(ds) else None
    if not isinstance(first, (list, tuple)):
        raise ConfigError(
            f"datamodule {name} training items are {layout(first)}, needs (x, y) or (x, y, index) with class labels y "
            "(or a dynamics_dataloader())"
        )
    if not (isinstance(first, (list, tuple)) and len(first) >= 3):  # (x, y): the row is the index
        ds, collate = WithIndex(ds), _AppendIndex(collate)
    return DataLoader(
        ds,
        batch_size=base.batch_size or 1,
        sampler=ResumableSampler(len(ds), shuffle=False, seed=0),
        collate_fn=collate,
        num_workers=base.num_workers,
    )


def loss_dynamics_problems(module: nn.Module, datamodule: Any = None, *, probe: bool = True) -> list[str]:
    """What ``module`` / ``datamodule`` lack for :class:`callbacks.loss_dynamics.LossDynamics` (empty: nothing).

    Args:
        module: The LightningModule (``module(x) -> logits [B, K]``).
        datamodule: Its datamodule, or ``None`` to check the module alone.
        probe: Check ``module(x)`` on a dynamics batch gives logits ``[B, K]`` with the labels in ``[0, K)``.
    """
    name = type(module).__name__
    problems = []
    if not has_forward(module):
        problems.append(f"model {name} has no forward(x) -> logits [B, K]")
    if datamodule is None:
        return problems
    dname = type(datamodule).__name__
    try:
        loader = dynamics_loader(datamodule)
        batch = small_batch(loader)
    except ConfigError as err:
        return [*problems, str(err)]
    except Exception as err:  # noqa: BLE001
        return [*problems, f"datamodule {dname} gives no dynamics batch ({type(err).__name__}: {err})"[:240]]
    own = isinstance(datamodule, DynamicsData)
    if not labelled(batch) or len(batch) < 3:
        shown = _labels_shown(batch, drop_last=not own and isinstance(batch, (list, tuple)))
        problems.append(
            f"datamodule {dname} {'dynamics' if own else 'training'} batches are {shown}, needs "
            f"{'(x, y, index)' if own else '(x, y)'} with class labels y [B]"
        )
    elif probe and not problems:
        problem, k = logit_problem(module, batch[0], None)
        if problem:
            problems.append(problem)
        elif int(batch[1].max()) >= k or int(batch[1].min()) < 0:
            problems.append(f"datamodule {dname} labels {batch[1].tolist()} are outside model {name}'s {k} logits")
    return problems


# -- QuantCalibration / MaskedLMQuantCalibration ---------------------------------------------------------------------
def _lm_net_problems(net: nn.Module, where: str, masked: bool) -> list[str]:
    if masked:
        encoder, head = protocol_members(MaskedLMNet)
        enc = getattr(net, encoder, None)
        if enc is None or not hasattr(enc, "embeddings") or not hasattr(getattr(enc, "encoder", None), "layer"):
            return [f"{where} has no BERT {encoder} (encoder.embeddings + encoder.encoder.layer): not a masked LM"]
        if not isinstance(getattr(net, head, None), nn.Module):
            return [f"{where} has no masked-LM {head}"]
        return []
    missing = missing_members(net, CausalLMNet)
    if missing:
        return [f"{where} is not a causal LM: no {', '.join(missing)} (needs {', '.join(CAUSAL_LM_PARTS)})"]
    problems = []
    for i, block in enumerate(net.blocks):
        for part, norm in (("mixer", "norm1"), ("mlp", "norm2")):
            sub = getattr(block, part, None)
            if not isinstance(getattr(getattr(block, norm, None), "weight", None), torch.Tensor):
                problems.append(f"{where}.blocks.{i} has no {norm} with a weight before its {part}")
            elif sub is None or not any(isinstance(m, nn.Linear) for m in sub.modules()):
                problems.append(f"{where}.blocks.{i}.{part} has no linear layers to quantize")
    return problems


def quant_calibration_problems(
    module: nn.Module, datamodule: Any = None, *, net_attr: str = "net", masked: bool = False
) -> list[str]:
    """What ``module`` / ``datamodule`` lack for :class:`callbacks.quant_calibration.QuantCalibration`
    (``masked=True``: :class:`~callbacks.quant_calibration.MaskedLMQuantCalibration`) (empty: nothing).

    Args:
        module: The LightningModule holding the LM at ``net_attr``.
        datamodule: Its datamodule, or ``None`` to check the module alone.
        net_attr: The callback's ``net_attr``.
        masked: Check for a :class:`MaskedLMNet` instead of a :class:`CausalLMNet`.
    """
    name = type(module).__name__
    net = getattr(module, net_attr, None)
    if not isinstance(net, nn.Module):
        problems = [f"model {name} has no LM at {net_attr!r} (callbacks.quant_calibration.net_attr)"]
    else:
        problems = _lm_net_problems(net, f"model {name}.{net_attr} ({type(net).__name__})", masked)
    if datamodule is None:
        return problems
    dname = type(datamodule).__name__
    for split in ("train", "val"):
        batch, why = sample_batch(datamodule, split)
        if why:
            problems.append(f"datamodule {dname} {why}")
        elif not (isinstance(batch, dict) and {"input_ids", "labels"} <= set(batch)):
            problems.append(
                f"datamodule {dname} {split} batches are {layout(batch)}, needs dicts with input_ids, labels"
            )
    return problems


# -- ClassifierQuantCalibration --------------------------------------------------------------------------------------
def classifier_quant_problems(module: nn.Module, datamodule: Any = None, *, probe: bool = True) -> list[str]:
    """What ``module`` / ``datamodule`` lack for :class:`callbacks.quant_classifier.ClassifierQuantCalibration`
    (empty: nothing).

    Args:
        module: The LightningModule (``module(x) -> logits [B, C]``, with ``nn.Linear`` / ``nn.Conv2d`` layers).
        datamodule: Its datamodule, or ``None`` to check the module alone.
        probe: Check ``module(x)`` on a test batch gives logits ``[B, C]``.
    """
    name = type(module).__name__
    problems = []
    if not has_forward(module):
        problems.append(f"model {name} has no forward(x) -> logits [B, C]")
    if not any(isinstance(m, (nn.Linear, nn.Conv2d)) for m in module.modules()):
        problems.append(f"model {name} has no nn.Linear or nn.Conv2d layer to quantize")
    if datamodule is None:
        return problems
    dname = type(datamodule).__name__
    batches = {}
    for split in ("train", "test"):
        batch, why = sample_batch(datamodule, split)
        if why:
            problems.append(f"datamodule {dname} {why}")
        elif not labelled(batch):
            shown = _labels_shown(batch)
            problems.append(
                f"datamodule {dname} {split} batches are {shown}, needs (x, y, ...) with class labels y [B]"
            )
        else:
            batches[split] = batch
    if probe and not problems:
        problem, _ = logit_problem(module, batches["test"][0], None)
        if problem:
            problems.append(problem)
    return problems


def refuse(what: str, problems: Sequence[str]) -> None:
    """Raise the one-line :class:`ConfigError` ``<what>: <problem>; <problem>`` when ``problems`` is not empty."""
    if problems:
        raise ConfigError(f"{what}: " + "; ".join(problems))


# -- the contracts, one per callback ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contract:
    """One callback's contract: its check and what the module and the datamodule provide (one line each, markdown).

    Attributes:
        callback: The callback class's name (in ``callbacks/``).
        module: What the module provides.
        datamodule: What the datamodule provides.
        check: The pure check, ``check(module, datamodule, **settings) -> list[str]``.
        settings: Keyword arguments of ``check`` that select this callback's variant of it.
    """

    callback: str
    module: str
    datamodule: str
    check: Callable[..., list[str]]
    settings: dict[str, Any] = field(default_factory=dict)

    def problems(self, module: nn.Module, datamodule: Any = None) -> list[str]:
        """What the pair lacks under the callback's default settings (empty: it meets the contract)."""
        return self.check(module, datamodule, **self.settings)


def _names(proto: type, suffix: str = "") -> str:
    return ", ".join(f"`{n}{suffix}`" for n in protocol_members(proto))


_LABELLED = "`(x, y, ...)`, `y` integer labels `[B]`"
CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "TestTimeAdaptation",
        f"{_names(Classifier, ': int >= 2')}; `forward(x) -> logits [B, C]`; LayerNorm / BatchNorm / GroupNorm / "
        f"InstanceNorm layers (`params=norm`); {_names(MultimodalTTA, '(x)')} for `method=sumi`",
        f"test batches {_LABELLED} (optional: a `val` split, EATA's Fisher anchor)",
        tta_problems,
    ),
    Contract(
        "LossDynamics",
        "`forward(x) -> logits [B, K]`",
        f"{_names(DynamicsData, '()')} yielding `(x, y, index)` over the un-augmented training rows, or a map-style "
        "`train` split of `(x, y)` (scored in order, row = index)",
        loss_dynamics_problems,
    ),
    Contract(
        "QuantCalibration",
        f"a causal LM at `module.net` ({_names(CausalLMNet)}; `blocks` of `norm1`/`mixer`/`norm2`/`mlp` with "
        "`nn.Linear`s: `layers.lm.CausalLM`)",
        'train / val batches `{"input_ids", "labels"}`',
        quant_calibration_problems,
    ),
    Contract(
        "MaskedLMQuantCalibration",
        f"a masked LM at `module.net` ({_names(MaskedLMNet)}: a BERT encoder and an MLM head)",
        "the same, labels `-100` off the masked positions",
        quant_calibration_problems,
        {"masked": True},
    ),
    Contract(
        "ClassifierQuantCalibration",
        "`forward(x) -> logits [B, C]` with at least one `nn.Linear` / `nn.Conv2d` (every one is quantized; grouped "
        "convolutions get no SmoothQuant scale)",
        f"train (calibration) and test (scoring) batches {_LABELLED}",
        classifier_quant_problems,
    ),
)


def contract_table() -> str:
    """:data:`CONTRACTS` as the markdown table of ``docs/extending.md``."""
    rows = ["| callback | the module provides | the datamodule provides |", "|---|---|---|"]
    rows += [f"| `{c.callback}` | {c.module} | {c.datamodule} |" for c in CONTRACTS]
    return "\n".join(rows)
