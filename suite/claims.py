"""Claims as data: the spec's ``claims:`` judged by :mod:`suite.stats`, one :class:`ClaimResult` per claim.

A claim spec (``conf/claim/<slug>.yaml``) declares its claims before the runs::

    claims:
      - id: sb_vs_rope_8x                          # unique on the page
        text: "At 8x the training length, stick-breaking has lower perplexity than softmax+RoPE"
        metric: test/ppl_len1024                   # per-seed final value of each entry (best-validation weights
                                                   # when the runs test them: `evaluate: best`, the default)
        entries: [stickbreaking, softmax_rope]     # the method, then what it is compared with
        baseline_metric: null                      # optional: the compared side's metric, when it differs (e.g. one
                                                   # entry whose runs score the method and a baseline beside it:
                                                   # entries [forecast, forecast], metric test/miou, baseline_metric
                                                   # test/miou_copy_last; paired by seed by construction)
        higher_is_better: false
        kind: superiority                          # superiority | non_inferior | equivalent
        delta: 0.5                                 # smallest effect of interest (the margin for the other kinds)
        delta_why: "a tenth of the paper's gap"    # where delta comes from
        primary: true                              # the paper's headline: Holm's correction across the primaries
        published: -3.2                            # the paper's own difference, method minus compared-with (the page
                                                   # shows it signed like ours: positive = the claimed direction)
        paired: true                               # optional: default, paired when both entries ran the same seeds
                                                   # and their data depend on the seed (`data.seed` = the run seed)
        converge: [stickbreaking, softmax_rope]    # optional: entries whose convergence the verdict needs [entries]
        deterministic: false                       # optional: one value a side, no noise (an exact solve)

A standard two-entry comparison needs no hook code: :func:`judge_claims` reads the per-seed values, the pairing, the
convergence of the entries (:func:`suite.stats.converged`), and decides (:func:`suite.stats.decide`); Holm's
correction runs across the primary claims (:func:`apply_holm`) and the weak-baseline rule is applied explicitly
(:func:`apply_weak_baselines`). A hook that needs more (a phenomenon check, a per-setting best baseline) builds
:class:`Claim` objects itself and calls :func:`judge`, or states a verdict without an interval
(:func:`stated`), and returns a :class:`HookResult`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from suite import stats
from suite.report import entry_curves, patience_plateau, sizing_patience, sizing_untrained

CLAIM_KEYS = (
    "id",
    "text",
    "metric",
    "baseline_metric",
    "entries",
    "higher_is_better",
    "kind",
    "delta",
    "delta_why",
    "primary",
    "published",
    "paired",
    "converge",
    "deterministic",
)


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, declared before the runs (module docstring)."""

    id: str
    text: str
    metric: str
    entries: tuple[str, str]
    higher_is_better: bool
    kind: str = "superiority"
    delta: float = 0.0
    delta_why: str = ""
    primary: bool = False
    published: float | None = None
    paired: bool | None = None
    converge: tuple[str, ...] | None = None
    deterministic: bool = False
    baseline_metric: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in stats.KINDS:
            raise ConfigError(f"claim {self.id}: kind={self.kind!r} must be one of {list(stats.KINDS)}")
        if not (isinstance(self.delta, int | float) and self.delta >= 0):
            raise ConfigError(f"claim {self.id}: delta={self.delta!r} must be a number >= 0")
        if self.kind != "superiority" and self.delta <= 0:
            raise ConfigError(f"claim {self.id}: a {self.kind} claim needs its margin delta > 0")
        if len(self.entries) != 2 or (self.entries[0] == self.entries[1] and self.metrics[0] == self.metrics[1]):
            raise ConfigError(
                f"claim {self.id}: entries={list(self.entries)} must name two different runs, or one run with a "
                "`baseline_metric` (two metrics of the same runs)"
            )

    @property
    def sign(self) -> float:
        return 1.0 if self.higher_is_better else -1.0

    @property
    def metrics(self) -> tuple[str, str]:
        """The metric read on each side: ``metric`` for the method, ``baseline_metric`` (default the same) for what it
        is compared with (e.g. a baseline scored inside the same run: copy-last beside the forecast)."""
        return self.metric, self.baseline_metric or self.metric

    @property
    def sides(self) -> tuple[str, str]:
        """The two sides' names on the page: the entries, or ``entry:metric`` when one entry holds both."""
        if self.entries[0] != self.entries[1]:
            return self.entries
        return f"{self.entries[0]}:{self.metrics[0]}", f"{self.entries[1]}:{self.metrics[1]}"


def parse_claims(spec: Mapping[str, Any]) -> list[Claim]:
    """The spec's ``claims:`` as :class:`Claim` objects; a malformed claim is a ConfigError naming the key."""
    raw = spec.get("claims") or []
    if not isinstance(raw, list):
        raise ConfigError(f"claims={raw!r} must be a list of claims (keys {list(CLAIM_KEYS)})")
    names = [e["name"] for e in spec.get("runs", [])]
    out, seen = [], set()
    for i, c in enumerate(raw):
        if not isinstance(c, Mapping):
            raise ConfigError(f"claims[{i}]={c!r} must be a mapping")
        unknown = sorted(set(c) - set(CLAIM_KEYS))
        if unknown:
            raise ConfigError(f"claims[{i}] has unknown keys {unknown} (known: {list(CLAIM_KEYS)})")
        missing = [k for k in ("id", "text", "metric", "entries", "higher_is_better") if k not in c]
        if missing:
            raise ConfigError(f"claims[{i}] lacks {missing}")
        if c["id"] in seen:
            raise ConfigError(f"claims: id {c['id']!r} appears twice")
        seen.add(c["id"])
        entries = tuple(c["entries"])
        bad = [e for e in entries if e not in names]
        if bad:
            raise ConfigError(f"claim {c['id']}: entries {bad} are not runs of the claim (runs: {names})")
        for key in ("higher_is_better", "paired", "primary", "deterministic"):
            if key in c and c[key] is not None and not isinstance(c[key], bool):
                raise ConfigError(f"claim {c['id']}: {key}={c[key]!r} must be true or false")
        if not isinstance(c["higher_is_better"], bool):
            raise ConfigError(f"claim {c['id']}: higher_is_better must be true or false")
        conv = c.get("converge")
        if conv is not None and sorted(set(conv) - set(names)):
            raise ConfigError(
                f"claim {c['id']}: converge names runs that do not exist: {sorted(set(conv) - set(names))}"
            )
        out.append(
            Claim(
                id=str(c["id"]),
                text=str(c["text"]),
                metric=str(c["metric"]),
                entries=entries,  # type: ignore[arg-type]
                higher_is_better=c["higher_is_better"],
                kind=str(c.get("kind", "superiority")),
                delta=float(c.get("delta", 0.0)),
                delta_why=str(c.get("delta_why", "")),
                primary=bool(c.get("primary", False)),
                published=None if c.get("published") is None else float(c["published"]),
                paired=c.get("paired"),
                converge=None if conv is None else tuple(conv),
                deterministic=bool(c.get("deterministic", False)),
                baseline_metric=None if c.get("baseline_metric") is None else str(c["baseline_metric"]),
            )
        )
    return out


@dataclass
class ClaimResult:
    """What the runs say about one claim: the verdict row of the page, and the data behind it.

    Attributes:
        id, text, metric, kind, entries, primary, delta: from the :class:`Claim`.
        published: the paper's difference, signed like ``diff`` (positive = the claimed direction).
        verdict: one of :data:`suite.stats.VERDICTS`.
        diff, lo, hi: the difference (positive = the claimed direction) and its 95% interval; ``None`` without one.
        n: seeds on each side; paired: paired by seed (else Welch); p: the decision's p-value; p_holm: Holm-adjusted
            (primary claims only).
        values: entry -> {seed: value} (what the verdict read).
        seeds_needed: the seeds (per side) an interval of half-width ``delta`` would need, from the spread seen.
        why: the qualifier of the verdict (underfit entries, the opposite holds, no effect as large as delta, Holm,
            a weak baseline, a phenomenon absent).
        evidence: a hook's extra words on the numbers (optional).
        against: the baselines the weak-baseline rule checks (default: the entries after the first).
    """

    id: str
    text: str
    verdict: str
    metric: str = ""
    kind: str = "superiority"
    entries: tuple[str, ...] = ()
    primary: bool = False
    delta: float = 0.0
    delta_why: str = ""
    published: float | None = None
    diff: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: tuple[int, ...] = ()
    paired: bool | None = None
    p: float | None = None
    p_holm: float | None = None
    p_against: str = "0"
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    seeds_needed: int | None = None
    why: str = ""
    evidence: str = ""
    against: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.verdict not in stats.VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(map(repr, stats.VERDICTS))}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries"] = list(self.entries)
        d["n"] = list(self.n)
        d["against"] = None if self.against is None else list(self.against)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClaimResult:
        d = dict(d)
        d["entries"] = tuple(d.get("entries") or ())
        d["n"] = tuple(d.get("n") or ())
        if d.get("against") is not None:
            d["against"] = tuple(d["against"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class Table:
    """A table a hook returns: ``columns`` and ``rows`` of cells (strings or numbers), a title and an optional note
    (one paragraph under it)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Figure:
    """A figure a hook drew into the page's folder."""

    title: str
    path: Path


@dataclass
class HookResult:
    """What a results-page hook returns: its verdicts (beside the spec's declared claims), extra tables, figures and
    notes (short paragraphs); never markdown. Hook signature: ``hook(records, spec, out_dir) -> HookResult``
    (``spec`` a :class:`ClaimSpec`).

    Attributes:
        verdicts: verdicts the hook judged itself (:func:`judge`, :func:`judge_values`, :func:`stated`); one with
            the id of a declared claim replaces the engine's verdict of it.
        tables, figures, notes: the page's extra sections.
        convergence: entry -> ``(converged, reading)`` that replaces the convergence rule's for that entry (a
            longer-run check, a solver's stationarity): the declared claims are judged with it.
        absent: claim id -> why its phenomenon never appeared (``inconclusive: phenomenon absent``).
    """

    verdicts: list[ClaimResult] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    convergence: dict[str, tuple[bool, str]] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)


# --- per-seed values and pairing -------------------------------------------------------------------------------------


def seed_values(records: Sequence[Any], entry: str, metric: str) -> dict[str, float]:
    """``{seed: value}`` of ``metric`` over the runs of ``entry`` (non-finite and missing values dropped; seeds as
    strings, the data file's keys)."""
    out = {}
    for r in records:
        if r.name != entry:
            continue
        v = r.metrics.get(metric)
        if v is not None and math.isfinite(float(v)):
            out[str(r.seed)] = float(v)
    return out


def data_follows_seed(record: Any) -> bool:
    """Whether a run's data depend on its seed: its datamodule config has ``seed`` equal to the run's seed."""
    data = (getattr(record, "config", None) or {}).get("data") or {}
    return isinstance(data, Mapping) and "seed" in data and str(data["seed"]) == str(record.seed)


def default_paired(records: Sequence[Any], a: str, b: str) -> bool:
    """Paired by default when both entries ran the same seeds and every run's data depend on its seed (so seed ``s``
    of ``a`` and of ``b`` saw the same data, split and evaluation samples)."""
    if a == b:  # two metrics of the same runs: seed s is the same run on both sides
        return any(r.name == a for r in records)
    ra = [r for r in records if r.name == a]
    rb = [r for r in records if r.name == b]
    if not ra or not rb or {str(r.seed) for r in ra} != {str(r.seed) for r in rb}:
        return False
    return all(data_follows_seed(r) for r in (*ra, *rb))


# --- judging ---------------------------------------------------------------------------------------------------------


def judge_values(
    claim: Claim,
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    paired: bool,
    unconverged: Mapping[str, str] | None = None,
    absent: str | None = None,
) -> ClaimResult:
    """The verdict of ``claim`` on per-seed values ``a`` (the method) and ``b`` (what it is compared with).

    Args:
        claim: the claim.
        a, b: ``{seed: value}``.
        paired: pair by seed (else Welch).
        unconverged: entry -> why it had not converged; any entry there makes the verdict ``inconclusive:
            underfit`` (the interval is still shown).
        absent: why the phenomenon the claim is about never appeared: ``inconclusive: phenomenon absent``.
    """
    base = ClaimResult(
        id=claim.id,
        text=claim.text,
        verdict=stats.NOISE,
        metric=claim.metric if claim.baseline_metric is None else f"{claim.metric} vs {claim.baseline_metric}",
        kind=claim.kind,
        entries=claim.entries,
        primary=claim.primary,
        delta=claim.delta,
        delta_why=claim.delta_why,
        published=None if claim.published is None else claim.sign * claim.published,
        values={claim.sides[0]: dict(a), claim.sides[1]: dict(b)},
        paired=paired,
    )
    if paired:
        common = sorted(set(a) & set(b), key=str)
        a, b = {s: a[s] for s in common}, {s: b[s] for s in common}
    base.n = (len(a), len(b))
    res = base
    if not a or not b:
        res = replace(base, why="no finished runs on one side")
    else:
        try:
            if claim.deterministic:
                iv = stats.exact_interval([claim.sign * v for v in a.values()], [claim.sign * v for v in b.values()])
            else:
                iv = stats.interval(a, b, paired=paired, sign=claim.sign)
        except ValueError as err:
            res = replace(base, why=f"no interval: {err}")
        else:
            if iv.se == 0 and not claim.deterministic:  # every seed agrees exactly: no t interval; the sign test
                return _finish(_no_spread(base, claim, iv), absent, unconverged)
            verdict, p, why = stats.decide(iv, kind=claim.kind, delta=claim.delta)
            spread = stats.spread_for_plan(iv, list(a.values()), list(b.values()))
            needed = stats.seeds_for_half_width(spread, claim.delta, paired=paired) if claim.delta > 0 else None
            against = {
                "superiority": "delta" if "as large as delta" in why else "0",
                "non_inferior": "-delta",
                "equivalent": "±delta",
            }[claim.kind]
            res = replace(
                base,
                verdict=verdict,
                diff=iv.diff,
                lo=iv.lo,
                hi=iv.hi,
                p=p,
                p_against=against,
                why=why,
                seeds_needed=needed,
            )
    return _finish(res, absent, unconverged)


def _finish(res: ClaimResult, absent: str | None, unconverged: Mapping[str, str] | None) -> ClaimResult:
    """The verdict after the gates: absent, then underfit, each keeping what the interval alone read."""
    alone = ""
    if res.p is not None:
        alone = f"; the interval alone reads `{res.verdict}`" + (f" ({res.why})" if res.why else "")
    if absent:  # the phenomenon never appeared: longer training or more seeds would not make the claim testable
        return replace(res, verdict=stats.ABSENT, why=absent + alone)
    if unconverged:  # runs that had not converged cannot show the effect either way
        which = "; ".join(f"{n}: {w}" for n, w in unconverged.items())
        return replace(res, verdict=stats.UNDERFIT, why=f"not converged: {which}" + alone)
    return res


def _no_spread(base: ClaimResult, claim: Claim, iv: stats.Interval) -> ClaimResult:
    """Every seed gave the same difference (a rank, an AUC of 1, a tie): no t interval exists, and seeds that agree
    are no proof of an exact result. The exact sign test decides instead: with n seeds all on one side of the null,
    p = 2 * 0.5 ** n (n >= 6 to reach 0.05); the difference must also clear ``delta`` (or the margin)."""
    n = min(iv.n)
    d = iv.diff
    null = -claim.delta if claim.kind == "non_inferior" else 0.0
    p = min(1.0, 2 * 0.5**n) if d != null else 1.0
    if claim.kind == "equivalent":
        ok, bad = abs(d) < claim.delta, abs(d) > claim.delta
    else:
        ok = d > null and not (claim.kind == "superiority" and 0 < d < claim.delta)
        bad = d < null or (claim.kind == "superiority" and 0 <= d < claim.delta)
    if p < stats.ALPHA and (ok or bad):
        verdict = stats.REPRODUCED if ok else stats.NOT_REPRODUCED
        why = f"every one of {n} seeds gave the difference {d:+.4g}: sign test p = {p:.3g}"
    else:
        verdict = stats.NOISE
        why = (
            f"every one of {n} seeds gave the difference {d:+.4g} (no spread, so no t interval); the sign test "
            f"needs at least 6 agreeing seeds (p = {p:.3g} with {n})"
        )
    return replace(base, verdict=verdict, diff=d, lo=d, hi=d, p=p, p_against="sign test", why=why)


def judge(
    claim: Claim,
    records: Sequence[Any],
    convergence: Mapping[str, tuple[bool, str]] | None = None,
    *,
    absent: str | None = None,
) -> ClaimResult:
    """:func:`judge_values` on the records: the claim's metric per seed, its pairing (declared, else
    :func:`default_paired`), and the convergence of its ``converge`` entries (``convergence``: entry -> ``(ok,
    reading)``; an entry missing there counts as converged, e.g. one that trains nothing)."""
    a, b = claim.entries
    paired = claim.paired if claim.paired is not None else default_paired(records, a, b)
    convergence = convergence or {}
    needs = claim.converge if claim.converge is not None else claim.entries
    unconverged = {n: convergence[n][1] for n in needs if n in convergence and not convergence[n][0]}
    res = judge_values(
        claim,
        seed_values(records, a, claim.metrics[0]),
        seed_values(records, b, claim.metrics[1]),
        paired=paired,
        unconverged=unconverged,
        absent=absent,
    )
    lost = []
    for side, entry, metric in zip(claim.sides, claim.entries, claim.metrics, strict=True):
        for r in records:
            v = r.metrics.get(metric) if r.name == entry else None
            if v is not None and not math.isfinite(float(v)):
                lost.append(f"{side} seed {r.seed}")
    if lost:  # a diverged seed is left out of the interval, and the page says so
        res = replace(res, evidence="; ".join(filter(None, [res.evidence, f"non-finite, left out: {', '.join(lost)}"])))
    return res


def stated(
    id: str, text: str, verdict: str, why: str, *, evidence: str = "", primary: bool = False, against=None
) -> ClaimResult:
    """A verdict with no interval behind it (a phenomenon absent before any comparison, an exact property of the
    method, a sanity check read from a table): the page shows the reason in place of an interval."""
    return ClaimResult(id=id, text=text, verdict=verdict, why=why, evidence=evidence, primary=primary, against=against)


def judge_claims(
    claims: Sequence[Claim],
    records: Sequence[Any],
    convergence: Mapping[str, tuple[bool, str]] | None = None,
    absent: Mapping[str, str] | None = None,
) -> list[ClaimResult]:
    """Every declared claim judged on ``records`` (a claim with no runs on a side is kept, with its reason);
    ``absent``: claim id -> why its phenomenon never appeared."""
    absent = absent or {}
    return [judge(c, records, convergence, absent=absent.get(c.id)) for c in claims]


def apply_holm(results: list[ClaimResult], alpha: float = stats.ALPHA) -> list[ClaimResult]:
    """Holm's correction across every primary claim of the page, whatever it read (a claim with no p, one stated
    absent or without an interval, counts with p = 1, so the family never shrinks with the results); each gets
    ``p_holm``, and a decided primary (``reproduced`` / ``not reproduced``) whose adjusted p is not below ``alpha``
    reads ``within noise`` and says so. Apply it before the weak-baseline rule. Exploratory claims are left as
    they are."""
    idx = [i for i, r in enumerate(results) if r.primary]
    if len(idx) < 2:
        return results
    adjusted = stats.holm([1.0 if results[i].p is None else results[i].p for i in idx])
    out = list(results)
    for i, ph in zip(idx, adjusted, strict=True):
        r = replace(out[i], p_holm=ph)
        if r.verdict in (stats.REPRODUCED, stats.NOT_REPRODUCED) and ph >= alpha and r.p is not None:
            why = f"read `{r.verdict}` before Holm's correction across {len(idx)} primary claims (p {ph:.3g})"
            r = replace(r, verdict=stats.NOISE, why=why)
        out[i] = r
    return out


def apply_weak_baselines(results: list[ClaimResult], weak: Mapping[str, str]) -> tuple[list[ClaimResult], list[str]]:
    """The weak-baseline rule: a ``reproduced`` read against a weak baseline (its ``against``, else the claim's
    entries after the first) reads ``inconclusive: weak baseline``. Returns the results and one line per flip."""
    out, notes = [], []
    for r in results:
        against = r.against if r.against is not None else r.entries[1:]
        hit = [n for n in against if n in weak]
        if r.verdict != stats.REPRODUCED or not hit:
            out.append(r)
            continue
        which = ", ".join(f"`{n}`" for n in hit)
        out.append(replace(r, verdict=stats.WEAK, why=f"read `{stats.REPRODUCED}` against {which}, a weak baseline"))
        notes.append(f"`{r.id}`: {which} " + "; ".join(weak[n] for n in hit))
    return out, notes


def counts(results: Sequence[ClaimResult]) -> dict[str, int]:
    """How many claims read each verdict word (for the README's and the overview's counts)."""
    out = {v: 0 for v in stats.VERDICTS}
    for r in results:
        out[r.verdict] += 1
    return out


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:+.{digits}g}"


def interval_text(r: ClaimResult) -> str:
    """``+0.3 [-0.2, 0.8]`` (or the reason there is no interval)."""
    if r.diff is None:
        return "—"
    if r.lo == r.hi:
        return f"{fmt(r.diff)} (exact)"
    return f"{fmt(r.diff)} [{fmt(r.lo)}, {fmt(r.hi)}]"


def mean_of(values: Mapping[str, float]) -> float:
    return statistics.fmean(values.values()) if values else math.nan


# --- the typed spec a hook receives ----------------------------------------------------------------------------------

CONVERGE_KEYS = ("tol", "rel", "frac")
EVALUATE = ("best", "last")


@dataclass
class ClaimSpec:
    """A claim spec (``conf/claim/<slug>.yaml``) with its parsed parts; every hook receives it.

    Attributes:
        slug: the claim's name.
        raw: the spec as read (``spec.get(key)`` / ``spec[key]`` read it, for keys a hook owns).
        claims: the declared claims.
        sizing_metric, higher_is_better: the validation metric convergence is judged on, and its direction.
        tol, rel, frac: the convergence rule's tolerance (absolute ``tol``, else ``rel`` of the best value) over the
            last ``frac`` of training (spec key ``converge: {tol, rel, frac}``).
        patience: runs that early stopping ends: plateaued = no new best in the last ``patience`` validations.
        untrained: entries that train nothing, with the reason.
        evaluate: ``best`` (the test metric at the best-validation checkpoint, the default) or ``last`` (the final
            weights, where the paper's protocol says so: ``evaluate_why`` states it).
    """

    slug: str
    raw: dict[str, Any]
    claims: list[Claim] = field(default_factory=list)
    sizing_metric: str | None = None
    higher_is_better: bool = False
    tol: float | None = None
    rel: float = 0.01
    frac: float = 0.2
    patience: int | None = None
    untrained: dict[str, str] = field(default_factory=dict)
    evaluate: str = "best"

    @classmethod
    def from_dict(cls, slug: str, raw: Mapping[str, Any]) -> ClaimSpec:
        """Parse a spec; a malformed ``claims:`` / ``converge:`` / ``evaluate:`` is a ConfigError naming the key."""
        raw = dict(raw)
        conv = raw.get("converge") or {}
        if not isinstance(conv, Mapping) or sorted(set(conv) - set(CONVERGE_KEYS)):
            raise ConfigError(f"converge={conv!r} must be a mapping with keys among {list(CONVERGE_KEYS)}")
        for key, lo, hi in (("tol", 0.0, math.inf), ("rel", 0.0, 1.0), ("frac", 0.0, 1.0)):
            v = conv.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi):
                raise ConfigError(f"converge.{key}={v!r} must be a number in [{lo:g}, {hi:g}]")
        if conv.get("frac") is not None and not 0 < conv["frac"] < 1:
            raise ConfigError(f"converge.frac={conv['frac']!r} must lie strictly between 0 and 1")
        evaluate = str(raw.get("evaluate", "best"))
        if evaluate not in EVALUATE:
            raise ConfigError(f"evaluate={evaluate!r} must be one of {list(EVALUATE)}")
        return cls(
            slug=slug,
            raw=raw,
            claims=parse_claims(raw),
            sizing_metric=raw.get("sizing_metric"),
            higher_is_better=bool(raw.get("sizing_higher_is_better", False)),
            tol=None if conv.get("tol") is None else float(conv["tol"]),
            rel=float(conv.get("rel", 0.01)),
            frac=float(conv.get("frac", 0.2)),
            patience=sizing_patience(raw),
            untrained=sizing_untrained(raw),
            evaluate=evaluate,
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def claim(self, id: str) -> Claim:
        for c in self.claims:
            if c.id == id:
                return c
        raise KeyError(f"no claim {id!r} in the {self.slug} spec")

    def convergence(self, records: Sequence[Any], metric: str | None = None) -> dict[str, tuple[bool, str]]:
        """Entry -> ``(converged, reading)`` on ``metric`` (default the sizing metric), by the convergence rule
        (:func:`suite.stats.converged`, or the early-stopping rule with ``patience``); entries that train nothing
        count as converged. Empty without a sizing metric."""
        metric = metric or self.sizing_metric
        if not metric:
            return {}
        out: dict[str, tuple[bool, str]] = {}
        for name in dict.fromkeys(r.name for r in records):
            if name in self.untrained:
                out[name] = (True, f"trains nothing: {self.untrained[name]}")
                continue
            curves = entry_curves(records, name, metric)
            if self.patience is not None:
                out[name] = patience_plateau(curves, patience=self.patience, higher_is_better=self.higher_is_better)
            else:
                c = stats.converged(
                    curves,
                    higher_is_better=self.higher_is_better,
                    frac=self.frac,
                    tol=self.tol,
                    rel=self.rel,
                    scored_at_end=self.evaluate == "last",
                )
                out[name] = (c.ok, c.reading)
        return out

    def rule_text(self) -> str:
        """The convergence rule in one sentence, for the page."""
        metric = self.sizing_metric
        better = "higher" if self.higher_is_better else "lower"
        if self.patience is not None:
            return (
                f"an entry converged when, on every seed, none of its last {self.patience} validations set a new "
                f"best `{metric}` ({better} is better; the runs' early stopping)"
            )
        tol = f"{self.tol:g}" if self.tol is not None else f"{self.rel:.0%} of the best value"
        return (
            f"an entry converged when, on every seed, its best-so-far `{metric}` ({better} is better) gained at "
            f"most {tol} over the last {self.frac:.0%} of training; a run that got worse after its best converged "
            "at its best, and the seed spread is never the tolerance"
        )
