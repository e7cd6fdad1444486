"""Reproducers that call the kernel: a script that imports it by its import path, rebuilds the
failing problem (literals, or an ``.npz`` beside the report), calls it with the same arguments and
checks it under the same numerics, so that running the script raises the same report.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import numpy as np

from gmm_kernels.base import KernelAdapter
from gmm_kernels.registry import names as builtin_names
from gmm_kernels.resolve import load_object
from gmm_kernels.user import FunctionAdapter, RoutedFunctionAdapter
from gmm_ref import Numerics, Problem
from gmm_ref.repro import numerics_source, problem_source

__all__ = ["contents_shift", "kernel_reproducer", "locate"]


def contents_shift(call: int) -> int:
    """How many places the operands' elements of call ``call`` (0-based) of a sequence of one shape are rotated
    from the first call's: the second call keeps the first's contents (only its group sizes change), every later
    call has new ones."""
    return max(call - 1, 0)


def _importable(spec: str, obj: Any) -> bool:
    try:
        return load_object(spec) is obj
    except Exception:  # noqa: BLE001 - anything that stops the import means "not by this path"
        return False


def locate(adapter: KernelAdapter) -> str | None:
    """The spec ``gmm_kernels.resolve_kernel`` rebuilds ``adapter`` from in a fresh process: the one it
    was resolved from, a built-in name, or the import path of its function or class; None if none."""
    if adapter.origin is not None:
        return adapter.origin
    if isinstance(adapter, (FunctionAdapter, RoutedFunctionAdapter)):
        fn = adapter.fn
        spec = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
        return spec if "<" not in spec and not spec.startswith("__main__") and _importable(spec, fn) else None
    if adapter.name in builtin_names():
        return adapter.name
    cls = type(adapter)
    spec = f"{cls.__module__}:{cls.__qualname__}"
    no_arguments = all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                       for p in inspect.signature(cls).parameters.values())
    return spec if no_arguments and _importable(spec, cls) else None


def _kernel_lines(adapter: KernelAdapter) -> list[str]:
    spec = locate(adapter)
    options = ""
    if isinstance(adapter, (FunctionAdapter, RoutedFunctionAdapter)):
        options += f", convention={adapter.convention!r}"
    if adapter.tiling is not None:
        options += f", tiling={tuple(adapter.tiling)!r}"
    if spec is None:
        return [f"# {adapter.name} cannot be imported by path (defined in __main__ or inside a function):",
                "# put your kernel function in place of YOUR_KERNEL",
                f"kernel = gmm_kernels.resolve_kernel(YOUR_KERNEL{options})"]
    return [f"kernel = gmm_kernels.resolve_kernel({spec!r}{options})  # imports it"]


def kernel_reproducer(adapter: KernelAdapter, problem: Problem, *, numerics: Numerics, wrt: str | None = None,
                      cotangent: np.ndarray | None = None, determinism: bool = False,
                      before: tuple[list[int], ...] = (), until_it_fails: tuple[int, int] | None = None,
                      before_routings: tuple[Any, ...] = (),
                      directory: str | os.PathLike[str] | None = None) -> str:
    """The script for a failure of ``adapter`` on ``problem``: its forward output (``determinism``: two runs
    compared bit for bit), or with ``wrt`` and ``cotangent`` its gradient w.r.t. ``wrt``. ``before``: the group
    sizes of the calls made first on the same kernel with the same operands (a kernel that keeps its first
    call's group sizes fails only after them). ``until_it_fails``: (calls that failed, calls made) of an
    intermittent failure; the script then repeats the calls until one fails, or says that none did.
    ``before_routings``: a routed kernel's routings of the same shape called first (the graph mode)."""
    extra = {"cotangent": cotangent} if wrt is not None and cotangent is not None else {}
    imports, lines = problem_source(problem, extra=extra, directory=directory)
    imports = [*imports, "import gmm_kernels"]
    if until_it_fails is None:
        head = [f"# gmm-harness reproducer: {adapter.name} ({adapter.convention}); running it raises the same report"]
    else:
        head = [f"# gmm-harness reproducer: {adapter.name} ({adapter.convention}); an intermittent failure "
                f"({until_it_fails[0]} of {until_it_fails[1]} calls failed): it calls the kernel until a call "
                "raises the report, or says how many passed"]
    lines += _kernel_lines(adapter)
    lines.append(f"numerics = {numerics_source(numerics)}")
    label = adapter.name if wrt is None else f"{adapter.name} d/d{wrt}"
    call = f"calls the kernel with {adapter.convention}'s arguments, gmm_ref.arguments(problem)"
    calls = []
    if not isinstance(problem, Problem):  # a routing: the routed reference, compared as the check compares it
        for j, earlier in enumerate(before_routings):  # the calls the failing one came after, on the same kernel
            _, built = problem_source(earlier, directory=directory)
            lines += [line.replace("problem = gmm_ref.Routing(", f"call_{j + 1} = gmm_ref.Routing(") for line in built]
            calls.append(f"kernel.run(call_{j + 1})  # call {j + 1}, which passed")
        calls += [f"out = kernel.run(problem)  # calls the kernel with {adapter.convention}'s arguments",
                  f"gmm_ref.assert_routed_matches(out, kernel.reference_for(problem), numerics=numerics, "
                  f"kernel={label!r}, output=kernel.convention_facts.output)"]
        return "\n".join([*head, *imports, *lines, *calls])
    if before:  # the harness's call j had the first call's operands rotated by contents_shift(j) elements
        imports = [*imports, "import numpy as np", "from gmm_kernels.sandbox.recycle import recycling"]
        roll = "np.roll(problem.{0}, max(j - 1, 0) - " + str(contents_shift(len(before))) + ")"
        calls.append(f"for j, sizes in enumerate({list(before)!r}):  # the calls before: other sizes and contents")
        calls.append(f"    kernel.run(problem.replace(group_sizes=np.array(sizes, np.{problem.group_sizes.dtype}), "
                     f"lhs={roll.format('lhs')}, rhs={roll.format('rhs')}))")
    if wrt is None:
        calls += [f"out = kernel.run(problem)  # {call}",
                  f"gmm_ref.assert_matches_reference(out, problem, numerics=numerics, kernel={label!r})"]
        if determinism:
            calls.append(f"gmm_ref.assert_deterministic(out, kernel.run(problem), problem, kernel={label!r})")
    else:
        calls += [f"grads = kernel.vjp(problem, cotangent)  # the kernel's backward: {call}, then this cotangent",
                  f"want = gmm_ref.gradients(problem, cotangent)[{wrt!r}]  # d/d{wrt} as a problem of its own",
                  f"gmm_ref.assert_matches_reference(grads[{wrt!r}], want, numerics=numerics, kernel={label!r})"]
    if before:  # in the same buffers, at the same addresses, as the harness made them
        calls = ["with recycling():", *("    " + line for line in calls)]
    if until_it_fails is None:
        lines += calls
    else:
        tries = max(100, 5 * -(-until_it_fails[1] // max(until_it_fails[0], 1)))  # a few times the calls per failure
        lines.append(f"for attempt in range({tries}):  # until a call fails")
        lines += ["    " + line for line in calls]
        lines.append(f"print(f'all {{attempt + 1}} calls passed (the harness saw {until_it_fails[0]} of "
                     f"{until_it_fails[1]} fail): run it again')")
    return "\n".join([*head, *imports, *lines])
