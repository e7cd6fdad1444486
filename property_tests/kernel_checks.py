"""The harness's kernel checks, as pytest tests: every selected kernel in every mode, and against the goldens.

The plugin collects this module itself whenever a run asks for the harness's checks (``--pyargs
property_tests --gmm-kernel ...``), so checking one kernel never collects the harness's own tests. This
repository's suite imports the goldens check alone (``tests/golden/test_goldens.py``): every built-in kernel in every
mode is the main job's table (``gmm-harness check``, which CI runs on both legs), not repeated by the suite. The
modes (the ``gmm_mode`` parameter, the plugin's: the default modes and the ``--gmm-tier``'s opt-in ones) run in
``property_tests.checks.engine.RUN_ORDER`` (the modes most likely to fail first): under pytest's ``-x`` a broken
kernel's run stops at its first failing mode. Under ``--gmm-tier`` each mode runs the tier's plan
(``property_tests.checks.tiers``), and a tier's time budget gives each passed mode its share of rounds of new examples
(a test is one mode: the share comes after the mode's first run, where the main job's budget counts from the
start of the kernel's run).
A mode in which an adapter declares a known upstream bug (``known_issues``) is a strict xfail: the harness must
keep catching that bug.

(Not named ``test_*.py``: a directory pytest walks does not collect it a second time.)
"""

from __future__ import annotations

import time

import pytest

import golden
from gmm_kernels import Status
from golden.judge import check_goldens, reasons_text, scope_reasons
from golden.store import MANIFEST
from property_tests.checks.causes import declarations
from property_tests.checks.check import MODE_RESULTS, check_mode
from property_tests.checks.engine import spend_rounds
from property_tests.checks.failures import raise_failure
from property_tests.checks.tiers import examples_in_default_run, first_round_seed
from property_tests.plugin import tier, tier_modes

__all__ = ["CAUSE", "CAUSES", "CHECK", "GOLDEN_DATA", "test_kernel_matches_goldens", "test_kernel_matches_reference"]

#: the keys of a kernel check's ``user_properties`` entries, ``(kernel name, mode)`` and a failure's short
#: cause: the plugin prints a failure as soon as it is reported; and what it found, by cause
#: (``property_tests.checks.causes``), which the plugin sums at the end of the run
CHECK, CAUSE, CAUSES = "gmm_check", "gmm_cause", "gmm_causes"
#: the goldens the ``golden`` package ships (in a checkout and in an install alike)
GOLDEN_DATA = golden.DATA


@pytest.mark.kernel
def test_kernel_matches_reference(gmm_kernel, gmm_mode, request, gmm_check_run):
    mode = gmm_mode
    why = gmm_kernel.available()
    if why is not None:
        pytest.skip(f"{gmm_kernel.name} unavailable: {why}")
    request.node.user_properties.append((CHECK, (gmm_kernel.name, mode)))
    known = gmm_kernel.known_issue(mode)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known upstream bug: {known}"))
    # the default run (no --gmm-kernel): a routed kernel that runs interpreted gets few examples a mode
    named = bool(request.config.getoption("--gmm-kernel"))
    plan = tier(request.config)
    checks = dict(run=gmm_check_run, max_examples=None if named else examples_in_default_run(gmm_kernel, None),
                  tier=plan)
    result = check_mode(gmm_kernel, mode, **checks)
    if plan is not None and plan.budget:  # the mode's share of the kernel's time, after its first run
        deadline = time.perf_counter() + plan.budget / len(tier_modes(request.config))
        rounds = spend_rounds({mode: result}, lambda m, s: check_mode(gmm_kernel, m, seed=s, **checks),
                              MODE_RESULTS, deadline=deadline, first=first_round_seed(plan, None),
                              clock=time.perf_counter)
        for _, joined in rounds:
            result = joined  # the last round's is the check's
    if result.status is Status.UNSUPPORTED:
        if known:
            pytest.fail(f"{gmm_kernel.name} / {mode}: declared known issue, but the mode is unsupported: "
                        f"{result.detail}")
        pytest.skip(f"{gmm_kernel.name} / {mode}: {result.detail}")
    if result.causes or result.evidence:  # the plugin sums the run's distinct causes at its end
        request.node.user_properties.append((CAUSES, {
            "where": mode, "causes": [dict(c) for c in result.causes], "evidence": dict(result.evidence),
            "declarations": declarations(gmm_kernel, result.evidence), "convention": gmm_kernel.convention}))
    if result.status.failure:
        cause = result.detail if result.status is Status.FAILED else f"{result.status.value}: {result.detail}"
        request.node.user_properties.append((CAUSE, cause))
    if result.status is Status.KNOWN_BUG:
        result.raise_for_status()  # the strict xfail: the bug is still caught
    raise_failure(result)


@pytest.mark.skipif(not (GOLDEN_DATA / MANIFEST).exists(),
                    reason=f"no golden manifest in {GOLDEN_DATA}: the golden package's data was not installed")
@pytest.mark.kernel
def test_kernel_matches_goldens(gmm_kernel, request):
    """Every golden case of the kernel's convention (the plugin selects the kernels)."""
    request.node.user_properties.append((CHECK, (gmm_kernel.name, "goldens")))
    results = check_goldens(gmm_kernel, GOLDEN_DATA)
    if not results:
        pytest.skip(f"no golden case in the {gmm_kernel.convention} convention")
    fails = [r for r in results if r.status is Status.FAILED]
    if fails:
        pytest.fail("\n\n".join(r.detail + "\n" + r.full_report() for r in fails), pytrace=False)
    if not any(r.status is Status.PASSED for r in results):
        pytest.skip(f"{gmm_kernel.name}: every golden case unsupported: {reasons_text(scope_reasons(results))}")
