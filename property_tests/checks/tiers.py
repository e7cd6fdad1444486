"""The tiers: what a run checks, in how many examples, at what cost, by name (docs/speed.md, "Tiers").

A *tier* is a Hypothesis profile (the settings of its examples) plus a plan for the run: examples per cell of
the covering design, the order of the cells, the modes, a time budget of new examples, and the example
database. The plugin (``--gmm-tier``), the main job (``gmm-harness check --tier``) and ``check_kernel(tier=...)``
take one by name:

- ``gmm-quick`` (pull requests): every cell of every mode's covering design once, one example each (so every
  static signature is compiled once and every pair of relations is still reached), the cells in
  :data:`property_tests.checks.cell_order.RELATION_WEIGHTS` order (the relations whose cells caught the most of the
  project's broken kernels first), the ``scale`` cells as always (one fixed problem each), derandomized (a routed
  kernel's cells of routed relations likewise, in their design's order);
- ``gmm-ci`` (the default): the profile's 50 examples spread over the cells, at least two a
  cell, derandomized;
- ``gmm-nightly``: ``gmm-ci``'s run (the same verdict first), then a time budget of rounds of new examples
  seeded by the date (new ones every day), the ``large`` mode (n/a with the reason where memory does not
  allow), and an example database (``$GMM_HARNESS_EXAMPLE_DB``, else :func:`default_example_db`);
- ``gmm-dev`` and ``gmm-thorough``: ``gmm-ci``'s plan under their own random profiles (15 and 400 examples
  spread over the cells, at least two a cell).

Every tier is a Hypothesis profile of its name too (``--hypothesis-profile``, ``property_tests.checks.profiles``),
which a run using the plugin loads for your own ``@given`` tests. This module also decides what a cell runs:
its examples (:func:`budgets`), its settings (:func:`cell_settings`) and how the verdict names them
(:func:`run_setting`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import ExampleDatabase

from gmm_kernels import KernelAdapter
from gmm_ref.names import did_you_mean
from property_tests.checks import example_db as example_dbs
from property_tests.checks.profiles import DEFAULT as DEFAULT_PROFILE
from property_tests.checks.profiles import profile as profile_settings

__all__ = [
    "DEFAULT",
    "ROUND_SEED_STEP",
    "ROUTED_INTERPRETED_EXAMPLES",
    "SAME_EVERY_RUN",
    "TIERS",
    "Tier",
    "budgets",
    "cell_settings",
    "chosen",
    "default_example_db",
    "example_db_spec",
    "examples_in_default_run",
    "first_round_seed",
    "run_setting",
    "same_every_run",
    "seed_of_the_day",
    "tier_of",
]

#: a round's seeds: round r of a run whose rounds start from seed S checks its cells under S + r * ROUND_SEED_STEP
ROUND_SEED_STEP = 1_000_003


@dataclass(frozen=True)
class Tier:
    """A run's plan by name.

    - ``profile``: the Hypothesis profile its kernel checks run under (their first round);
    - ``per_cell``: examples per cell of the covering design (None: the profile's ``max_examples`` spread over
      the cells, at least two a cell);
    - ``ordered_cells``: the cells in ``property_tests.checks.cell_order`` order (else the design's);
    - ``opt_in``: the opt-in modes it adds to the default ones;
    - ``budget``: seconds per kernel of rounds of new examples after its run (None: none);
    - ``dated_rounds``: the rounds start from :func:`seed_of_the_day` (new examples every day), else from 0;
    - ``example_db``: with no database given, :func:`default_example_db` (else none).
    """

    name: str
    doc: str
    profile: str
    per_cell: int | None = None
    ordered_cells: bool = False
    opt_in: tuple[str, ...] = ()
    budget: float | None = None
    dated_rounds: bool = False
    example_db: bool = False

    def describe(self, max_examples: int | None = None) -> str:
        """One line: what the tier runs (``max_examples``: the examples a mode a run asked for instead)."""
        if max_examples is not None:
            parts = [f"at most {max_examples} example{'s' * (max_examples != 1)} a mode (--max-examples), spread over "
                     "the covering design's cells (fewer than two a cell: the first cells only)"]
        elif self.per_cell is not None:
            parts = [f"{self.per_cell} example{'s' * (self.per_cell != 1)} a cell of every mode's covering design"
                     + (", the cells most likely to fail first" if self.ordered_cells else "")]
        else:
            n = profile_settings(self.profile).max_examples
            parts = [f"the {self.profile} profile's {n} examples a mode spread over the covering design's cells, "
                     "at least 2 a cell"]
        parts.append("derandomized" if profile_settings(self.profile).derandomize else "random")
        if self.budget:
            parts.append(f"then {self.budget:g} s a kernel of new examples"
                         + (" (rounds seeded by the date)" if self.dated_rounds else ""))
        if self.opt_in:
            parts.append(" and ".join(self.opt_in) + " mode" + "s" * (len(self.opt_in) > 1))
        if self.example_db:
            parts.append("an example database")
        return f"{self.name}: " + ", ".join(parts)


TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("gmm-quick", "pull requests: every cell once, the cells most likely to fail first", "gmm-quick",
         per_cell=1, ordered_cells=True),
    Tier("gmm-ci", "the main job and CI: the derandomized gmm-ci profile, at least two examples a cell", "gmm-ci"),
    Tier("gmm-nightly", "nightly: gmm-ci, then a time budget of new examples, the large mode, an example database",
         "gmm-ci", opt_in=("large",), budget=5 * 60, dated_rounds=True, example_db=True),
    Tier("gmm-dev", "a quick local loop of random examples (gmm-ci's plan under the gmm-dev profile)", "gmm-dev"),
    Tier("gmm-thorough", "400 random examples a mode (gmm-ci's plan under the gmm-thorough profile)", "gmm-thorough"),
)}
DEFAULT = DEFAULT_PROFILE  # the default tier: the one that runs the default profile, of the same name
#: the tiers whose first run is gmm-ci's examples (its profile, its spread over the cells), the same every run:
#: there a mode in which a kernel declares a known upstream bug must still catch it (:func:`same_every_run`)
SAME_EVERY_RUN = tuple(t.name for t in TIERS.values()
                       if (t.profile, t.per_cell) == (TIERS[DEFAULT].profile, TIERS[DEFAULT].per_cell))


def same_every_run(tier: str | None, *, seed: int | None, max_examples: int | None) -> bool:
    """Whether a run of ``tier`` draws the same examples every run (no seed, no example count asked, a tier of
    :data:`SAME_EVERY_RUN`): there a declared known bug must still be caught (``engine.known_bugs_not_caught``)."""
    return seed is None and max_examples is None and tier in SAME_EVERY_RUN


def tier_of(name: object, *, option: str = "tier") -> Tier:
    """The tier named ``name``; ``ValueError`` naming ``option`` (with a did-you-mean) for any other value."""
    if isinstance(name, Tier):
        return name
    if isinstance(name, str) and name in TIERS:
        return TIERS[name]
    raise ValueError(f"{option}: expected one of {', '.join(TIERS)}, got {name!r}{did_you_mean(name, TIERS)}")


def chosen(tier: object, profile: str | None, *, default_profile: str | None = None) -> Tier | None:
    """The tier a check runs: ``tier``, else the tier ``profile`` names (every tier is a profile of its name),
    else None (a profile's settings, or the settings in force, under gmm-ci's plan). A ``profile`` given with a
    ``tier`` (other than ``default_profile``, the caller's default) must be the tier's: ``ValueError`` naming
    both otherwise."""
    if tier is None:
        return TIERS.get(profile) if isinstance(profile, str) else None
    t = tier_of(tier)
    if profile not in (None, default_profile, t.name, t.profile):
        raise ValueError(f"tier: {t.name} runs under the {t.profile} profile; profile={profile!r} was given with it "
                         "(give one of them)")
    return t


def seed_of_the_day() -> int:
    """The first seed of a dated tier's rounds: today's date (UTC) as YYYYMMDD, new examples every day."""
    return int(time.strftime("%Y%m%d", time.gmtime()))


def first_round_seed(tier: Tier | None, seed: int | None) -> int:
    """Where a time budget's rounds start: :func:`seed_of_the_day` for a dated tier, else the run's seed (or 0)."""
    return seed_of_the_day() if tier is not None and tier.dated_rounds else (seed or 0)


def default_example_db() -> Path:
    """``$XDG_CACHE_HOME/gmm-harness/examples`` (``~/.cache/gmm-harness/examples``): a tier's database when none
    is given (gmm-nightly's), beside the compilation cache, so a CI cache of ``~/.cache/gmm-harness`` keeps both."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gmm-harness" / "examples"


def example_db_spec(given: object, tier: Tier | None) -> object:
    """The example database of a run: the one ``given``, else ``$GMM_HARNESS_EXAMPLE_DB``, else the tier's
    default (:func:`default_example_db` where the tier keeps one), else None."""
    if given is not None or os.environ.get(example_dbs.ENV) is not None:
        return given
    return str(default_example_db()) if tier is not None and tier.example_db else None


def budgets(max_examples: int | None, profile: str | None, cap: int | None, cells: int,
            per_cell: int | None = None) -> list[int]:
    """Examples per cell of the covering design. Under a profile's budget (``max_examples`` None) every
    cell runs, at least twice (Hypothesis' first example of a run is its simplest), so that every pair
    of relations is reached: the budget is spread over the cells and raised where it is too small; under a
    tier's ``per_cell`` every cell runs that many. A limit given explicitly (``max_examples``, or the kernel's
    own cap ``adapter.max_examples``) is kept: when it is below two per cell (``per_cell`` a cell) only the
    first cells run (the design's first cells cover the most pairs) and the result says which pairs were
    missed."""
    if per_cell is not None and max_examples is None:
        run = cells if cap is None else max(1, min(cells, cap // per_cell))
        return [per_cell] * run
    limits = [x for x in (max_examples, cap) if x is not None]
    if not limits or min(limits) >= 2 * cells:
        n = min(limits) if limits else profile_settings(profile).max_examples
        per, extra = divmod(n, cells)
        return [max(2, per + (i < extra)) for i in range(cells)]
    n = min(limits)
    run = max(1, n // 2)
    return [n // run + (i < n % run) for i in range(run)]


def cell_settings(profile: str | None, n: int, seeded: bool, database: ExampleDatabase | None,
                  cell: str) -> settings:
    """The settings of one cell's run; its example database (if any) keyed for the ``cell``."""
    base = profile_settings(profile)
    if database is None:  # none asked for: a seeded run (derandomized, or --seed) keeps none, others the profile's
        database = None if seeded else base.database
    return settings(
        base,
        max_examples=n,
        deadline=None,
        # each cell runs under a seed of its own (derived from the cell, or from the given seed), so that
        # a derandomized profile stays deterministic while the cells draw different values
        derandomize=False if seeded else base.derandomize,
        # the cell's own key: a saved example replays in the check that drew it (Hypothesis keys by the property's
        # source, the same for every cell)
        database=example_dbs.for_cell(database, cell),
        phases=[p for p in base.phases if p is not Phase.explain],  # it explains our property, not the kernel
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def run_setting(profile: str | None, seed: int | None, max_examples: int | None = None,
                tier: Tier | None = None) -> str:
    """How the examples were chosen, for the verdict: a seed, or a profile (and whether derandomized), and the
    tier where it is not gmm-ci's plan."""
    base = profile_settings(profile)
    if tier is not None and tier.per_cell is not None and max_examples is None:
        n = f"{tier.per_cell} example{'s' * (tier.per_cell != 1)} a cell"
    else:
        n = f"{max_examples if max_examples is not None else base.max_examples} examples"
    if seed is not None:
        text = f"seed={seed} ({n})"
    else:
        name = profile or "settings in force"
        text = f"{name} profile ({'derandomized' if base.derandomize else 'random'}, {n})"
    return text if tier is None or tier.name == profile else f"{tier.name} tier, {text}"


#: examples a mode of a routed MoE kernel that runs interpreted here gets in the default run (every kernel at once):
#: one routing a cell of its covering design of routed relations (at most 23 cells), where a routing costs tens of
#: milliseconds to seconds (one interpreted program per live block); named (``--kernel``), it gets the profile's
ROUTED_INTERPRETED_EXAMPLES = 24


def examples_in_default_run(kernel: KernelAdapter, max_examples: int | None) -> int | None:
    """The examples per mode ``kernel`` gets in the default run: ``max_examples`` when given, else
    :data:`ROUTED_INTERPRETED_EXAMPLES` for a routed kernel that runs interpreted here (``interpreted()``), else
    None (the profile's budget, and the kernel's own ``max_examples`` cap)."""
    if max_examples is None and kernel.routed and kernel.interpreted():
        return ROUTED_INTERPRETED_EXAMPLES
    return max_examples
