"""The harness's Hypothesis profiles, under names of their own, registered on request (never at import).

- ``gmm-ci``: 50 examples, derandomized (the same examples on every run and
  every xdist worker), no deadline, ``print_blob``;
- ``gmm-quick``: 10 examples, derandomized (the kernel checks of the ``gmm-quick`` tier run one a cell);
- ``gmm-nightly``: 400 random examples, as ``gmm-thorough`` (the kernel checks of the ``gmm-nightly`` tier run
  ``gmm-ci``'s, then new ones for a time budget);
- ``gmm-dev``: 15 random examples, for a quick local loop;
- ``gmm-thorough``: 400 random examples.

Each is also a tier of its name (``property_tests.tiers``: what a run checks under it); a run of the plugin
with ``--gmm-tier NAME`` loads the profile ``NAME`` for your own ``@given`` tests. Registering them changes no
setting in force: a project's own ``ci`` profile (or Hypothesis' default) stays as it is until one of these is
loaded (``--hypothesis-profile=gmm-ci``, ``--gmm-kernel``, ``--gmm-tier``, or a project's conftest).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["DEFAULT", "PROFILES", "profile", "register_profiles"]

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
