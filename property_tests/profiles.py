"""The harness's Hypothesis profiles, registered on request (never at import).

- ``ci``: 50 examples, derandomized (the same examples on every run and
  every xdist worker), no deadline, ``print_blob``;
- ``dev``: 15 random examples, for a quick local loop;
- ``thorough``: 400 random examples.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "profile", "register_profiles"]

PROFILES = ("ci", "dev", "thorough")
_registered = False


def register_profiles() -> None:
    """Register the ``ci``, ``dev`` and ``thorough`` Hypothesis profiles (idempotent)."""
    global _registered
    if _registered:
        return
    # derandomize is explicit: under CI=true Hypothesis' defaults (which profiles inherit) derandomize
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("ci", derandomize=True, max_examples=50, **common)
    settings.register_profile("dev", derandomize=False, max_examples=15, **common)
    settings.register_profile("thorough", derandomize=False, max_examples=400, **common)
    _registered = True


def profile(name: str | None) -> settings:
    """The settings of the registered profile ``name`` (None: the settings in force)."""
    if name is None:
        return settings()
    register_profiles()
    return settings.get_profile(name)
