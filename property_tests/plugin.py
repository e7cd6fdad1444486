"""The gmm-harness pytest plugin: Hypothesis profiles and kernel selection options."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def _register_profiles() -> None:
    settings.register_profile(
        "ci", derandomize=True, deadline=None, print_blob=True, max_examples=30,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", deadline=None, max_examples=20, print_blob=True)
    settings.register_profile(
        "thorough", deadline=None, max_examples=500, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


def pytest_configure(config) -> None:
    _register_profiles()
