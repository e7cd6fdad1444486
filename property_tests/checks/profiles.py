"""The harness's Hypothesis profiles, under names of their own, registered on request (never at import).

- ``gmm-ci``: 50 examples, derandomized (the same examples on every run and
  every xdist worker), no deadline, ``print_blob``;
- ``gmm-quick``: 10 examples, derandomized (the kernel checks of the ``gmm-quick`` tier run one a cell);
- ``gmm-nightly``: 400 random examples, as ``gmm-thorough`` (the kernel checks of the ``gmm-nightly`` tier run
  ``gmm-ci``'s, then new ones for a time budget);
- ``gmm-dev``: 15 random examples, for a quick local loop;
- ``gmm-thorough``: 400 random examples.

Each is also a tier of its name (``property_tests.checks.tiers``: what a run checks under it); a run of the plugin
with ``--gmm-tier NAME`` loads the profile ``NAME`` for your own ``@given`` tests. Registering them changes no
setting in force: a project's own ``ci`` profile (or Hypothesis' default) stays as it is until one of these is
loaded (``--hypothesis-profile=gmm-ci``, ``--gmm-kernel``, ``--gmm-tier``, or a project's conftest).

:func:`pinned_constants`: the harness's own checks draw with Hypothesis' pool of *local constants* pinned
empty. Recent Hypothesis versions (6.170.15, the tested one) mix the literals of every loaded module outside
site-packages and the stdlib (a kernel repository, an editable install of the harness) into their draws, so
without the pin the examples of a seed depend on which modules the process happened to import (docs/speed.md,
"The same examples in every process").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

from hypothesis import HealthCheck, settings

__all__ = ["DEFAULT", "PROFILES", "pinned_constants", "profile", "register_profiles"]

PROFILES = ("gmm-ci", "gmm-quick", "gmm-nightly", "gmm-dev", "gmm-thorough")
DEFAULT = "gmm-ci"
_registered = False


def register_profiles() -> None:
    """Register the harness's profiles (:data:`PROFILES`; idempotent)."""
    global _registered
    if _registered:
        return
    # derandomize is explicit: under CI=true Hypothesis' defaults (which profiles inherit) derandomize
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("gmm-ci", derandomize=True, max_examples=50, **common)
    settings.register_profile("gmm-quick", derandomize=True, max_examples=10, **common)
    settings.register_profile("gmm-nightly", derandomize=False, max_examples=400, **common)
    settings.register_profile("gmm-dev", derandomize=False, max_examples=15, **common)
    settings.register_profile("gmm-thorough", derandomize=False, max_examples=400, **common)
    _registered = True


def profile(name: str | None) -> settings:
    """The settings of the registered profile ``name`` (None: the settings in force)."""
    if name is None:
        return settings()
    register_profiles()
    return settings.get_profile(name)


@contextlib.contextmanager
def pinned_constants() -> Iterator[None]:
    """While inside, Hypothesis draws with an empty pool of local constants, so that a seed's examples depend on
    the seed and the strategy alone, not on the modules loaded (reentrant; restored on exit).

    Hypothesis has no setting for it (6.170.15): its provider asks
    ``hypothesis.internal.conjecture.providers._get_local_constants()`` for the pool on a test case's first
    constant draw, and keeps the constants each draw's bounds permit in ``CONSTANTS_CACHE``. This replaces that
    function for the duration and empties that cache on the way in and out (entries made from another pool
    would otherwise be drawn from). The one use of Hypothesis' internals in the harness
    (``test_architecture.py`` allows it here alone): a Hypothesis that collects no local constants has nothing
    to pin, and one that collects them elsewhere gets a warning once, its examples depending on the modules
    loaded again (``tests/property_tests/test_determinism.py`` fails then), never an error."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - every Hypothesis the harness takes has it
        yield
        return
    get = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    empty = getattr(providers, "Constants", None)
    if get is None or cache is None or empty is None:
        if empty is not None:  # it collects them, not where this looks
            _warn_unpinned()
        yield
        return

    def pinned() -> object:
        return empty()  # a fresh empty pool for each test case that asks

    providers._get_local_constants = pinned  # inside another pin, ``get`` is that one's: restored on exit
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.cache.clear()


_warned: list[bool] = []


def _warn_unpinned() -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn("gmm-harness cannot pin Hypothesis' local constants in this Hypothesis version: the examples "
                      "drawn may depend on the modules loaded (docs/speed.md)", RuntimeWarning, stacklevel=4)
