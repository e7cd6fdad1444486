"""``gmm-harness coverage``: the pairs of relations each check reaches, without calling a kernel.

For every convention (as a user kernel of it sees it: every argument its
signature takes is drawn) or built-in ``--kernel`` (its declared scope
applied), and every mode, it draws exactly the examples ``check_mode`` would
draw under the ``gmm-ci`` profile (or ``--max-examples`` / ``--seed``) and
observes the relations they exhibit (``property_tests.strategies.design``).
The table shows ``reached/pairs`` per cell; ``-v`` lists every pair never
reached and every relation the convention cannot express, with the reason. It
exits 1 when some pair a convention can express is never reached.
"""

from __future__ import annotations

import argparse
from typing import Any

from gmm_kernels import KernelAdapter, Result, Status, resolve_kernels, wrap
from gmm_kernels.sandbox import device
from gmm_ref import conventions
from property_tests.checks.check import coverage
from property_tests.checks.modes import MODES, Unsupported, mode_covering, mode_routed_design
from property_tests.checks.profiles import DEFAULT
from property_tests.cli.options import add_device_option, modes_option

__all__ = ["add_parser", "run"]


def _never_called(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - coverage never calls a kernel
    raise AssertionError("gmm-harness coverage calls no kernel")


def add_parser(sub: Any) -> None:
    c = sub.add_parser("coverage", help="the pairs of relations each check reaches (no kernel is called)")
    c.add_argument("--convention", action="append", default=[],
                   help="a convention, as a user kernel of it is checked (repeatable; default: every one)")
    c.add_argument("--kernel", action="append", default=[], help="a built-in adapter, its scope applied (repeatable)")
    c.add_argument("--modes", default=None, metavar="M,M", help=f"the modes (default: all of {', '.join(MODES)})")
    c.add_argument("--max-examples", type=int, default=None,
                   help="examples per mode (default: the gmm-ci profile's, what the pytest plugin runs)")
    c.add_argument("--seed", type=int, default=None, help="draw with this seed (default: derandomized gmm-ci)")
    add_device_option(c.add_argument)  # no kernel runs, but what a torch kernel takes may depend on the device
    c.add_argument("-v", "--verbose", action="store_true",
                   help="list the pairs never reached and the relations a convention cannot express")


def _targets(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[KernelAdapter]:
    names = args.convention or ([] if args.kernel else [*conventions.names(), *conventions.routed_names()])
    targets: list[KernelAdapter] = []
    for name in names:
        try:  # a routed convention's: its covering design of routed relations (docs/coverage.md)
            targets.append(wrap(_never_called, name, name=f"<{conventions.get(name).name} kernel>"))
        except (KeyError, ValueError, TypeError) as exc:
            parser.error(f"--convention: {exc}")
    try:
        targets += resolve_kernels(args.kernel) if args.kernel else []
    except (KeyError, ValueError, TypeError, ImportError) as exc:
        parser.error(f"--kernel: {exc}")
    return targets


def _inexpressible(target: KernelAdapter, modes: list[str]) -> list[str]:
    seen: dict[str, str] = {}
    for mode in modes:
        try:  # a routed kernel's design is one for every mode
            designs = {"routed": mode_routed_design(target)} if target.routed else mode_covering(target, mode).designs
        except (Unsupported, Exception):  # noqa: BLE001 - the table already says why the mode is n/a
            continue
        for family, d in designs.items():
            for what, why in d.inexpressible:
                seen.setdefault(f"{family}: {what}", why)
    return [f"  {what}: {why}" for what, why in sorted(seen.items())]


def _cell(r: Result) -> str:
    if r.status is Status.UNSUPPORTED:
        return "n/a"
    text = f"{r.pairs[0]}/{r.pairs[1]}"
    return text if not r.missing else f"MISSING {len(r.missing)}: {text}"


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    modes = modes_option(args.modes, MODES, parser.error)
    if args.max_examples is not None and args.max_examples < 1:
        parser.error(f"--max-examples: expected a positive integer, got {args.max_examples}")
    try:
        device.select(args.device or "auto", option="--device")
    except ValueError as exc:
        parser.error(str(exc))
    targets = _targets(parser, args)
    profile = DEFAULT if args.seed is None else None
    width = max(len(t.name) for t in targets) + 2
    print(f"{'':<{width}}" + "".join(f"{m:<18}" for m in modes))
    missing, reached, checked, na = [], 0, 0, []
    for t in targets:
        row = []
        for mode in modes:
            r = coverage(t, mode, max_examples=args.max_examples, profile=profile, seed=args.seed)
            row.append(_cell(r))
            if r.status is Status.UNSUPPORTED:
                na.append(f"  {t.name} / {mode}: {r.detail}")
                continue
            checked += 1
            reached += r.pairs[0]
            missing += [f"  {t.name} / {mode} / {m}" for m in r.missing]
        print(f"{t.name:<{width}}" + "".join(f"{c:<18}" for c in row), flush=True)
    if checked == 0:
        parser.error("nothing to cover: every mode is n/a for every target")
    print(f"\n{reached} pairs of relations reached in {checked} (target, mode) cells; "
          f"{len(missing)} never reached ('n/a': the mode has no problems there; -v says why)")
    if args.verbose:
        for title, lines in (("never reached", missing), ("n/a", na)):
            if lines:
                print(f"\n{title}:\n" + "\n".join(lines))
        for t in targets:
            lines = _inexpressible(t, modes)
            if lines:
                print(f"\n{t.name}: relations and pairs it cannot express\n" + "\n".join(lines))
    elif missing:
        print("\n".join(missing[:20]))
    return 1 if missing else 0
