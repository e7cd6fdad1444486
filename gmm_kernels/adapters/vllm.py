"""vLLM's batched experts GEMM (``vllm.batched_moe``): ``invoke_moe_batched_triton_kernel``, a Triton kernel; and
vLLM's fused MoE (``vllm.fused_moe``, a routed kernel: :class:`VllmFusedMoE`), read from the same wheel by the same
loader (:func:`load_functions`).

vLLM cannot be installed beside the tested torch (its wheel pins another torch), and its package root imports
far more than this kernel needs. So the adapter reads the kernel's source from vLLM's wheel, untouched
(:data:`WHEEL_VERSION`, ``pip download --no-deps``; :func:`find_wheel` says where it looks), and runs only what the
GEMM needs (:func:`load_kernel`): from ``vllm/model_executor/layers/fused_moe/experts/fused_batched_moe.py`` the
three ``@triton.jit`` functions ``moe_mmk``, ``expert_triton_kernel``, ``batched_triton_kernel`` and the launcher
``invoke_moe_batched_triton_kernel``; from ``vllm/model_executor/layers/fused_moe/utils.py`` the launcher's helper
``normalize_batched_scales_shape``. They run with Triton's own ``triton`` and ``triton.language`` in place of
``vllm.triton_utils``'s, and ``use_tensor_descriptor()`` False (vLLM's TMA path, for Hopper and later, is off: the
interpreter and any GPU run the pointer path). Each function keeps its file name and line numbers, so a traceback
points into the wheel's file.

Where torch sees no GPU the kernels run in Triton's interpreter (``gmm_kernels.triton_interpreter``) on CPU
tensors; on a CUDA GPU with vLLM installed the installed package's function runs, else the wheel's, on CUDA
tensors. Either way the launch config is the problem's tiling, the convention's ``config`` argument (by default
``BLOCK_SIZE_M=16, BLOCK_SIZE_K=128, BLOCK_SIZE_N=32``, ``gmm_ref.conventions.vllm``), so that drawn extents
straddle tile edges. Every form the convention has runs interpreted, FP8 included (the interpreter's ``tl.dot``
of float8_e4m3fn codes reads NaN codes as finite: the harness fixes it, ``fp8_nan_dot`` in docs/triton.md).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import importlib
import importlib.util
import linecache
import os
import types
import zipfile
from typing import Any

import numpy as np

from gmm_kernels import device, triton_interpreter
from gmm_kernels.base import KernelAdapter, RoutedKernelAdapter, RoutedLimits
from gmm_kernels.convert import to_framework
from gmm_kernels.scope import Limits
from gmm_ref import Numerics, Problem

__all__ = ["KERNEL_FUNCTIONS", "KERNEL_MEMBER", "UTILS_FUNCTIONS", "UTILS_MEMBER", "WHEEL_ENV", "WHEEL_VERSION",
           "VllmBatchedMoE", "VllmFusedMoE", "WheelLayoutError", "find_wheel", "load_functions", "load_fused_moe",
           "load_kernel", "wheel_cache_dir"]

#: the vLLM release whose kernel is checked (scripts/setup.sh downloads its wheel)
WHEEL_VERSION = "0.33.0"
#: a vLLM wheel file (or a folder holding one) to read the kernel from, before the cache
WHEEL_ENV = "GMM_HARNESS_VLLM_WHEEL"
KERNEL_MEMBER = "vllm/model_executor/layers/fused_moe/experts/fused_batched_moe.py"
UTILS_MEMBER = "vllm/model_executor/layers/fused_moe/utils.py"
KERNEL_FUNCTIONS = ("moe_mmk", "expert_triton_kernel", "batched_triton_kernel", "invoke_moe_batched_triton_kernel")
UTILS_FUNCTIONS = ("normalize_batched_scales_shape",)
FUSED_MOE_MEMBER = "vllm/model_executor/layers/fused_moe/fused_moe.py"
#: the fused MoE GEMM of ``TritonExperts``: the kernel, its helper for other ranks' experts, and its launcher
FUSED_MOE_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel", "invoke_fused_moe_triton_kernel")
#: the command that puts the wheel where :func:`find_wheel` looks
DOWNLOAD = (f'python -m pip download --no-deps --only-binary=:all: vllm=={WHEEL_VERSION} '
            f'-d "${{XDG_CACHE_HOME:-$HOME/.cache}}/gmm-harness/wheels"')


class WheelLayoutError(RuntimeError):
    """The wheel does not hold the kernel where (or as) this loader expects it."""


def wheel_cache_dir() -> str:
    """``$XDG_CACHE_HOME/gmm-harness/wheels`` (``~/.cache`` without the variable)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gmm-harness", "wheels")


def find_wheel() -> str | None:
    """The vLLM wheel to read: :data:`WHEEL_ENV` (a wheel, or a folder holding vLLM :data:`WHEEL_VERSION`'s),
    else :data:`WHEEL_VERSION`'s in :func:`wheel_cache_dir`; None where there is none."""
    given = os.environ.get(WHEEL_ENV)
    if given and os.path.isfile(given):
        return given
    for folder in (given, wheel_cache_dir()):
        if folder and os.path.isdir(folder):
            found = sorted(glob.glob(os.path.join(folder, f"vllm-{WHEEL_VERSION}-*.whl")))
            if found:
                return found[-1]
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


def _no_allocator(*_args: Any, **_kwargs: Any) -> None:
    raise RuntimeError("vllm.triton_utils.allocation.set_triton_allocator: not loaded (the TMA path is off)")


def load_functions(wheel: str, members: tuple[tuple[str, tuple[str, ...]], ...], provided: dict[str, Any],
                   module_name: str) -> types.ModuleType:
    """A module holding the top-level functions ``members`` lists (``(member, names)`` pairs, loaded in that order,
    a later member's functions may read an earlier one's) from ``wheel``'s source, untouched, with ``provided`` as
    their globals (Triton's ``triton`` and ``tl`` added; ``@triton.jit`` reads ``TRITON_INTERPRET`` now). Each
    function keeps its file name and line numbers. Raises :class:`WheelLayoutError` naming what is missing where
    the wheel's layout differs, or a global the functions read that ``provided`` lacks."""
    import builtins

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


def load_kernel(wheel: str) -> types.ModuleType:
    """A module holding :data:`KERNEL_FUNCTIONS` and :data:`UTILS_FUNCTIONS` from ``wheel``'s source, run with
    Triton's ``triton`` and ``tl`` (:func:`load_functions`)."""
    import torch

    return load_functions(wheel, ((UTILS_MEMBER, UTILS_FUNCTIONS), (KERNEL_MEMBER, KERNEL_FUNCTIONS)),
                          dict(torch=torch, use_tensor_descriptor=lambda: False, set_triton_allocator=_no_allocator),
                          "gmm_kernels.adapters._vllm_fused_batched_moe")


class _Logger:
    """vLLM's logger where the loaded launcher warns (the TD path it would warn about is off)."""

    def warning_once(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    warning = info = debug = warning_once


def load_fused_moe(wheel: str) -> types.ModuleType:
    """A module holding :data:`FUSED_MOE_FUNCTIONS` from ``wheel``'s ``fused_moe.py`` (:func:`load_functions`):
    the launcher ``invoke_fused_moe_triton_kernel`` with vLLM's tensor-descriptor path off
    (``resolve_moe_use_td()`` False, as vLLM resolves it on CUDA unless ``VLLM_TRITON_USE_TD`` is set) and
    ``SWAP_AB`` off (``enable_swap_ab`` is False for unquantized operands in vLLM too: it is read under FP8 only)."""
    import torch

    return load_functions(wheel, ((FUSED_MOE_MEMBER, FUSED_MOE_FUNCTIONS),),
                          dict(torch=torch, Any=Any, set_triton_allocator=_no_allocator,
                               resolve_moe_use_td=lambda: False, enable_swap_ab=lambda *_a: False,
                               warn_if_moe_use_td_ineffective=lambda *_a, **_k: None, logger=_Logger()),
                          "gmm_kernels.adapters._vllm_fused_moe")


@functools.cache
def _loaded(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_kernel`, once per wheel and interpreter state (``@triton.jit`` reads it when run)."""
    return load_kernel(wheel)


@functools.cache
def _loaded_fused(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_fused_moe`, once per wheel and interpreter state."""
    return load_fused_moe(wheel)


def _installed() -> bool:
    """vLLM itself is installed (the CUDA path then runs its function)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


class VllmBatchedMoE(KernelAdapter):
    """``invoke_moe_batched_triton_kernel`` of vLLM's ``fused_batched_moe`` (from its wheel; interpreted where
    no GPU is seen)."""

    name = "vllm.batched_moe"
    convention = "vllm.batched_moe"
    requires = ("torch", "triton")
    needs = "vLLM's batched experts are Triton kernels"
    flush_subnormals = True

    def _kernel(self) -> Any:
        """The launcher: the installed vLLM's on a GPU where it is installed (and imports), else the wheel's."""
        return _launcher(("vllm.model_executor.layers.fused_moe.experts.fused_batched_moe",  # 0.33
                          "vllm.model_executor.layers.fused_moe.fused_batched_moe"),  # earlier releases
                         "invoke_moe_batched_triton_kernel", "batched experts", _loaded)

    def _unavailable(self) -> str | None:
        return _unavailable_here(self._kernel)

    def large_refusal(self) -> str | None:
        return None if device.on_cuda() else self._runs_interpreted("Triton's interpreter", takes="days")

    def _limits(self) -> Limits:
        """On a GPU: the convention's. In Triton's interpreter: extents up to 64 (up to 4 row tiles of 16 and 2
        column tiles of 32 at the default tiling, K within one tile of 128; the grid is experts x row tiles x
        column tiles, one interpreted program each, the cost grows with it)."""
        if device.on_cuda():
            return Limits()
        return Limits(max_extent=160)

    def numerics_for(self, problem: Problem) -> Numerics:
        """FP8: each K tile's ``tl.dot`` of codes in the tensor cores (about 14 bits kept on Hopper), promoted into
        the float32 accumulator with its scales (the block path; the per-tensor and per-token paths are declared
        the same, which a first run on a GPU confirms or refutes). float32 on a GPU: ``tl.dot``'s default
        input precision is TF32 (declared as bfloat16 products, a sound, slightly looser bound); Triton's
        interpreter multiplies float32 exactly."""
        base = super().numerics_for(problem)
        if self.scope is not None and self.scope.numerics is not None:
            return base
        if problem.scaled:
            tk = (problem.tiling or self.convention_facts.default_tiling)[1]
            return dataclasses.replace(base, promote_every=tk, partial_accumulate=2.0 ** -13)
        if device.on_cuda() and str(problem.lhs.dtype) == "float32":
            return dataclasses.replace(base, multiply="bfloat16")
        return base

    def call(self, A: Any, B: Any, C: Any, expert_num_tokens: Any, **kwargs: Any) -> Any:
        kernel = self._kernel()
        (a, b, c, counts), kw = to_framework("torch", (A, B, C, expert_num_tokens), kwargs)
        args = {"B_zp": None, "use_int8_w8a16": False, "use_int4_w4a16": False, "A_scale": None, "B_scale": None,
                "use_fp8_w8a8": False, "per_act_token_quant": False, "block_shape": None, **kw}
        args["compute_type"] = _triton_dtype(args.get("compute_type"), c.dtype)
        # the kernel writes the C it is given (a view into its guarded buffer: a write past it is seen there); on
        # CUDA to_framework made the operands on the selected device
        if device.on_cuda():
            kernel(a, b, c, counts, **{k: device.place(v) for k, v in args.items()})
            return c
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, as on a GPU, unwarned
            kernel(a, b, c, counts, **args)
        return c


def _launcher(modules: tuple[str, ...], name: str, what: str, loaded: Any) -> Any:
    """vLLM's launcher ``name``: the installed vLLM's (the first of ``modules`` holding it) on a GPU where vLLM is
    installed, else the one ``loaded(wheel, interpreted)`` reads from the wheel (``what`` names its kernel in the
    reason when there is no wheel)."""
    import torch

    if torch.cuda.is_available() and _installed():
        for module in modules:
            try:
                return getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
    wheel = find_wheel()
    if wheel is None:
        raise WheelLayoutError(f"no vLLM {WHEEL_VERSION} wheel found ({WHEEL_ENV} unset or holding none, none in "
                               f"{wheel_cache_dir()}): its {what} kernel is read from it; get it with: {DOWNLOAD}")
    return getattr(loaded(wheel, triton_interpreter.in_use()), name)


def _unavailable_here(kernel: Any) -> str | None:
    """Why a kernel of vLLM's wheel cannot run here (``kernel()`` loads it), or None."""
    import torch

    reason = triton_interpreter.unrunnable("vLLM")
    if reason is not None:
        return reason
    try:
        kernel()
    except WheelLayoutError as exc:
        return str(exc)
    if not torch.cuda.is_available():
        try:
            triton_interpreter.fix()
        except triton_interpreter.InterpreterDefect as exc:  # an unverified Triton whose interpreter errs
            return str(exc)
    return None


class VllmFusedMoE(RoutedKernelAdapter):
    """``invoke_fused_moe_triton_kernel`` of vLLM's ``fused_moe`` (``fused_moe_kernel``, unquantized; from its
    wheel, interpreted where no GPU is seen), on metadata ``moe_align_block_size`` builds
    (``gmm_ref.conventions.vllm.FUSED_MOE``), launched with ``FUSED_MOE_CONFIG`` (16 x 32 x 32 tiles)."""

    name = "vllm.fused_moe"
    convention = "vllm.fused_moe"
    requires = ("torch", "triton")
    needs = "vLLM's fused MoE is a Triton kernel"
    flush_subnormals = True

    def _kernel(self) -> Any:
        """The launcher: the installed vLLM's on a GPU where it is installed (and imports), else the wheel's."""
        return _launcher(("vllm.model_executor.layers.fused_moe.fused_moe",), "invoke_fused_moe_triton_kernel",
                         "fused MoE", _loaded_fused)

    def _unavailable(self) -> str | None:
        return _unavailable_here(self._kernel)

    def large_refusal(self) -> str | None:
        """In Triton's interpreter: a kernel that runs interpreted (the ``scale`` mode gives it fewer cells)."""
        return None if device.on_cuda() else self._runs_interpreted("Triton's interpreter", takes="days")

    def routed_limits(self) -> RoutedLimits:
        """The strategies' defaults (up to 40 tokens, 8 to 513 experts, top_k up to 8) with ``(K, N)`` extents
        around the launch config's tiles: ``(4, 4)``, ``(16, 8)`` (within one tile) and ``(40, 40)`` (K and N past
        one 32-wide tile, a masked tail each). Interpreted, a call costs about 10 ms per live program (live row
        blocks x column tiles)."""
        return RoutedLimits(extents=((4, 4), (16, 8), (40, 40)))

    def call(self, A: Any, B: Any, C: Any, topk_weights: Any, sorted_token_ids: Any, expert_ids: Any,
             num_tokens_post_padded: Any, mul_routed_weight: bool, top_k: int, config: Any = None,
             compute_type: Any = None) -> Any:
        kernel = self._kernel()
        tensors, _ = to_framework("torch", (A, B, C, topk_weights, sorted_token_ids, expert_ids,
                                            num_tokens_post_padded), {})
        a, b, c, w, ids, blocks, post = tensors
        args = (None, None, w, ids, blocks, post, mul_routed_weight, top_k, dict(config),
                _triton_dtype(compute_type, c.dtype), False, False, False, False, False)
        # the kernel writes the C it is given (its guarded copy: a write past it is seen in its margins); on CUDA
        # to_framework made the operands on the selected device
        if device.on_cuda():
            kernel(a, b, c, *(device.place(x) for x in args))
            return c
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, unwarned
            kernel(a, b, c, *args)
        return c


def _triton_dtype(given: Any, fallback: Any) -> Any:
    """vLLM's ``compute_type`` is a ``tl.dtype``: the one of ``given`` (a torch dtype, or None: ``fallback``)."""
    import torch
    import triton.language as tl

    if isinstance(given, tl.dtype):
        return given
    dt = given if isinstance(given, torch.dtype) else fallback
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dt]
