"""The check engine: what a kernel is checked in and how a run spends its examples, for every front-end.

``check`` runs one mode of a kernel (``check_mode``) or all of them (``check_kernel``) as Hypothesis properties;
``engine`` is the run policy every front-end shares (mode order, fail-fast, time-budget rounds); ``modes`` the
modes and the problems each draws, with the built problem sets of ``scale`` (and its routed cells) and ``large``;
``failures`` what a failure reports; ``tiers``, ``profiles`` and ``example_db`` the settings a run takes;
``declared`` a kernel's declared scope in the strategies' words. Nothing here knows a command line or pytest.
"""
