"""Triton kernels on a machine without a GPU: Triton's interpreter, with its known defects fixed.

Where torch sees no CUDA GPU, a ``@triton.jit`` kernel cannot be compiled (``RuntimeError: 0 active
drivers``); Triton's interpreter runs it instead, on NumPy, when ``TRITON_INTERPRET=1`` is set before
the kernel's module is imported (``@triton.jit`` reads it). :func:`use_if_no_gpu` sets it: the main
job and its workers, the pytest plugin and the resolver (before it imports ``pkg.module:fn``) call it.

The interpreter has nine defects that real kernels hit, each fixed here by patching
``triton.runtime.interpreter`` at runtime (:func:`fix`), for the Triton versions in :data:`VERIFIED`:

* ``bf16_dot``: ``tl.dot`` of bfloat16 blocks multiplies their raw uint16 bit patterns (bfloat16 is
  stored as its bits; upstream triton-lang/triton#11584);
* ``bf16_cast``: float32 -> bfloat16 casts truncate, where a GPU rounds to nearest even;
* ``bool_splat``: a comparison's result is tagged int32 though its data is bool, and splatting it into
  a block keeps int32: ``tl.load`` / ``tl.store`` raise ``mask has unsupported dtype``;
* ``range_int``: ``tl.range`` loop variables are Python ints, so ``i.to(tl.int64)`` raises;
* ``fp8_nan_dot``: ``tl.dot`` of float8_e4m3fn blocks decodes them through float16 with no NaN case: the
  NaN codes (0x7f, 0xff) count as +-480 (its ``dot_scaled`` path has the case; ``dot`` lacks it);
* ``bf16_arith``: ``binary_op`` applies NumPy's operator to the uint16 bits bfloat16 is stored as: ``x * y`` of
  two bfloat16 blocks multiplies the bits (unsloth's ``FUSE_MUL_POST``: the weight times the rounded product);
* ``int_annotation``: a scalar argument annotated with an integer type (``stride_cm: tl.int64``) is typed by its
  value (int32 below 2**31), where compiled code types it as annotated: ``row * stride`` wraps in int32 past
  2**31 - 1 where a GPU computes it in int64 (vLLM's batched experts, the large mode's strided cells);
* ``bf16_subnormal``: a bfloat16 -> float32 cast of a subnormal normalizes its mantissa and then clamps the exponent
  to 0: the value comes out up to 2**7 times too large (found by the wide mode on grouped-mm-bf16's 3d2d kernel);
* ``tf32_dot``: ``tl.dot`` of float32 blocks under ``input_precision="tf32"`` (Triton's default for float32)
  multiplies full float32 values, where NVIDIA tensor cores read TF32 (the low 13 mantissa bits dropped, unless
  the kernel rounds them itself): a float32 kernel passing on the CPU said nothing of its TF32 numerics.

For any other version nothing is patched: :func:`defects` runs a tiny probe kernel per defect
(``gmm_kernels.runtimes.triton_probes``) and :func:`fix` raises :class:`InterpreterDefect` naming those found,
so that a wrong result is reported as the interpreter's, never as the kernel's.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, MutableMapping
from glob import glob
from typing import Any

from gmm_kernels.runtimes import triton_bounds

__all__ = ["DEFECTS", "ENV", "VERIFIED", "InterpreterDefect", "defects", "explain", "fix", "imported_too_early",
           "in_use", "ready", "removed_features",
           "stale_kernels", "unfix", "unrunnable", "use_if_no_gpu"]

ENV = "TRITON_INTERPRET"
#: the Triton versions whose interpreter source the fixes were written against and tested with
VERIFIED = ("3.9.0",)
#: each defect the harness fixes: name -> what a kernel sees without the fix
DEFECTS = {
    "bf16_dot": "tl.dot of bfloat16 blocks multiplies their raw uint16 bit patterns (triton-lang/triton#11584)",
    "bf16_cast": "float32 -> bfloat16 casts truncate instead of rounding to nearest even",
    "bool_splat": "a comparison splatted into a block mask stays int32 ('mask has unsupported dtype')",
    "range_int": "tl.range loop variables are Python ints ('int' object has no attribute 'to')",
    "fp8_nan_dot": "tl.dot of float8_e4m3fn blocks reads the NaN codes (0x7f, 0xff) as +-480",
    "bf16_arith": "elementwise arithmetic and comparisons of two bfloat16 blocks act on their uint16 bits",
    "int_annotation": "a scalar argument annotated tl.int64 is typed by its value (int32 below 2**31), not as "
                      "annotated: its products wrap in int32",
    "bf16_subnormal": "bfloat16 -> float32 casts of subnormal values are wrong (the mantissa normalized, the "
                      "exponent then clamped to 0): 2.8e-40 becomes 5.9e-39",
    "tf32_dot": "tl.dot of float32 blocks under input_precision 'tf32' (Triton's default) multiplies full float32 "
                "values, where a GPU's tensor cores read 10 of their 23 mantissa bits (triton-lang/triton#4574)",
}
_NO_DRIVER = "0 active drivers"
_saved: dict[str, Any] = {}  # the interpreter's own functions, while fixed


class InterpreterDefect(ValueError):
    """Triton's interpreter computes something a GPU would not: a defect of the interpreter, not of the kernel
    (raised before anything is checked, as a usage error: the kernel cannot be checked here)."""


def _loaded() -> bool:
    return sys.modules.get("triton") is not None


def _triton_installed() -> bool:
    try:
        return _loaded() or importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # an entry in sys.modules that is not a module
        return False


def _no_gpu() -> bool:
    """True where torch sees no CUDA (or ROCm) GPU. Without a GPU device file the answer needs no torch."""
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/proc/driver/nvidia")) \
            and not glob("/dev/nvidia[0-9]*"):
        return True
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


def use_if_no_gpu(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``TRITON_INTERPRET=1`` in ``environ`` (default ``os.environ``) where Triton is installed and
    torch sees no GPU, unless it is set already (yours is kept). True when the interpreter is then in use."""
    env = os.environ if environ is None else environ
    if ENV not in env and _triton_installed() and _no_gpu():
        env[ENV] = "1"
    return in_use(env)


def unrunnable(what: str) -> str | None:
    """Why ``what``'s Triton kernels cannot run on the selected device here, or None: no GPU and the interpreter
    switched off, or a GPU seen (the interpreter is off, the kernels are compiled for it) but the CPU selected."""
    import torch

    from gmm_kernels.sandbox import device

    if not torch.cuda.is_available() and not use_if_no_gpu():
        return (f"no GPU here and {ENV} is off: {what}'s Triton kernels cannot run (unset {ENV} to run them in "
                "Triton's interpreter)")
    early = imported_too_early()
    if early is not None:
        return f"{what}'s Triton kernels cannot run in Triton's interpreter in this process: {early}"
    if torch.cuda.is_available() and not device.on_cuda():
        return (f"{what}'s Triton kernels are compiled for the GPU here (Triton's interpreter is off where a GPU "
                f"is seen); the selected device is {device.selected()} (--device)")
    return None


def imported_too_early() -> str | None:
    """Why Triton's interpreter cannot run kernels in this process, or None: Triton was imported before
    ``TRITON_INTERPRET=1`` was set (by a library imported earlier: ejkernel imports it), so Triton's own
    ``@triton.jit`` helpers (``tl.cdiv``, ``tl.sum``, ...) were made for a GPU, and every interpreted kernel that
    calls one raises ``Cannot call @triton.jit'd outside of the scope of a kernel``."""
    if not _loaded() or not in_use():
        return None
    try:
        from triton.language import standard
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    if not isinstance(getattr(standard, "cdiv", None), JITFunction):
        return None
    return (f"Triton was imported before {ENV}=1 was set, so its own @triton.jit helpers (tl.cdiv, tl.sum, ...) "
            f"were made for a GPU; set {ENV}=1 (gmm_kernels.runtimes.triton_interpreter.use_if_no_gpu()) before "
            "anything imports triton, or check the kernel in a process of its own (gmm-harness check does)")


def in_use(environ: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def _version() -> str:
    import triton

    return str(triton.__version__)


def fix() -> list[str]:
    """Patch the interpreter's nine defects (once per process) where Triton is imported, the interpreter is
    in use and its version is in :data:`VERIFIED`; the names of the defects fixed. An unverified version is
    probed instead: any defect found raises :class:`InterpreterDefect` naming it."""
    if not _loaded() or not in_use():
        return []
    if _version() not in VERIFIED:
        found = defects()
        if found:
            raise InterpreterDefect(
                f"Triton {_version()}'s interpreter (TRITON_INTERPRET=1, no GPU here) has defects that make kernels "
                f"compute what a GPU would not: {'; '.join(f'{d}: {DEFECTS[d]}' for d in found)}. gmm-harness fixes "
                f"them for Triton {', '.join(VERIFIED)} only; install that (gmm-harness[triton] with constraints.txt) "
                "or check the kernel on a GPU. This is the interpreter's fault, not the kernel's.")
        return []
    if not _saved:
        _patch()
    return list(DEFECTS)


def unfix() -> None:
    """Undo :func:`fix` (for tests that show each defect)."""
    from triton.runtime import interpreter as ti

    owners = {"module": ti, "InterpreterBuilder": ti.InterpreterBuilder, "InterpretedFunction": ti.InterpretedFunction,
              "GridExecutor": ti.GridExecutor}
    for name, value in _saved.items():
        owner, attr = name.split(".")
        setattr(owners[owner], attr, value)
    _saved.clear()


def _patch() -> None:
    import ml_dtypes
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    _saved.update({"InterpreterBuilder.create_dot": builder.create_dot,
                   "InterpreterBuilder.cast_impl": builder.cast_impl,
                   "InterpreterBuilder.create_splat": builder.create_splat,
                   "InterpreterBuilder.binary_op": builder.binary_op,
                   "module._patch_lang_core": ti._patch_lang_core,
                   "module._implicit_cvt": ti._implicit_cvt,
                   "InterpretedFunction.run": ti.InterpretedFunction.run})
    original_dot, original_cast, original_splat, original_core = (
        _saved["InterpreterBuilder.create_dot"], _saved["InterpreterBuilder.cast_impl"],
        _saved["InterpreterBuilder.create_splat"], _saved["module._patch_lang_core"])

    def as_float(handle: Any) -> Any:  # bfloat16 bits -> float32 values; others as they are
        return handle.data.view(ml_dtypes.bfloat16).astype(np.float32) if handle.dtype.scalar == tl.bfloat16 \
            else handle.data

    def as_value(handle: Any) -> Any:  # as_float, and float8e4nv codes -> float32 values, NaN codes NaN
        if handle.dtype.scalar != tl.float8e4nv:
            return as_float(handle)
        value = ti._convert_float(handle.data, handle.dtype.scalar, tl.float16, None).view(np.float16)
        return np.where(handle.data & np.uint8(0x7F) == np.uint8(0x7F), np.float32("nan"), value.astype(np.float32))

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if {a.dtype.scalar, b.dtype.scalar} == {tl.float32} and getattr(input_precision, "name", "") == "TF32":
            return _tf32_dot(np, ti, a, b, d)  # the tensor cores' operands: the low 13 mantissa bits dropped
        if not {tl.bfloat16, tl.float8e4nv} & {a.dtype.scalar, b.dtype.scalar, d.dtype.scalar}:
            return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        with np.errstate(all="ignore"):  # NaN and infinity propagate, as on a GPU, without a warning
            acc = np.matmul(as_value(a), as_value(b), dtype=np.float32) + as_float(d)
        if d.dtype.scalar == tl.bfloat16:  # a bfloat16 accumulator: round once, back to its bits
            return ti.TensorHandle(acc.astype(ml_dtypes.bfloat16).view(np.uint16), d.dtype.scalar)
        return ti.TensorHandle(acc.astype(d.data.dtype), d.dtype.scalar)

    def create_splat(self: Any, ret_ty: Any, arg: Any) -> Any:
        if arg.data.dtype == np.bool_:  # a comparison's result: a boolean block, tagged int1
            return ti.TensorHandle(np.full(ret_ty.shape, arg.data.reshape(-1)[0], dtype=np.bool_), tl.int1)
        return original_splat(self, ret_ty, arg)

    def patch_lang_core(lang: Any, scope: Any) -> None:
        original_core(lang, scope)
        scope.set_attr(lang, "range", _tensor_range(ti, tl, np))

    builder.create_dot = create_dot
    builder.cast_impl = _bf16_casts(original_cast)
    builder.create_splat = create_splat
    builder.binary_op = _bf16_binary_op(_saved["InterpreterBuilder.binary_op"], as_float)
    ti._patch_lang_core = patch_lang_core
    ti._implicit_cvt, ti.InterpretedFunction.run = _annotated_ints(_saved["module._implicit_cvt"],
                                                                   _saved["InterpretedFunction.run"])
    triton_bounds.install(_saved)  # every load and store checked against the launch's tensors


def _bf16_casts(original: Callable[..., Any]) -> Callable[..., Any]:
    """``cast_impl`` with float32 -> bfloat16 rounded to nearest even and bfloat16 -> float32 exact, as a GPU."""
    import ml_dtypes
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter as ti

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(src.data.astype(ml_dtypes.bfloat16).view(np.uint16), dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:  # the bits, shifted
            return ti.TensorHandle((src.data.astype(np.uint32) << np.uint32(16)).view(np.float32), dst_type.scalar)
        return original(self, src, dst_type)

    return cast_impl


def _tf32_dot(np: Any, ti: Any, a: Any, b: Any, d: Any) -> Any:
    """``a @ b + d`` of float32 blocks as tensor cores compute it under TF32 (:func:`_tf32` operands)."""
    with np.errstate(all="ignore"):
        acc = np.matmul(_tf32(np, a.data), _tf32(np, b.data), dtype=np.float32) + d.data
    return ti.TensorHandle(acc.astype(d.data.dtype), d.dtype.scalar)


def _tf32(np: Any, x: Any) -> Any:
    """float32 values as NVIDIA tensor cores read them under TF32 when the kernel does not round them itself: the
    low 13 mantissa bits dropped (toward zero); NaN and Inf as they are."""
    x = np.asarray(x, dtype=np.float32)
    cut = (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), cut, x)


class _AnnotatedInt(int):
    """An int argument of a kernel parameter annotated with an integer type (``tl.int64``), carrying that type."""

    ty: Any


def _int_annotations(fn: Any) -> dict[str, Any]:
    """``fn``'s non-constexpr parameters annotated with an integer type: name -> the ``tl`` dtype."""
    from triton import language as tl
    from triton.runtime.jit import _normalize_ty

    out = {}
    for name, annotation in inspect.get_annotations(fn).items():
        ty = _normalize_ty(annotation)
        if ty in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"):
            out[name] = tl.str_to_ty(ty, None)
    return out


def _annotated_ints(implicit_cvt: Callable[[Any], Any], run: Callable[..., Any]) -> tuple[Callable[..., Any], ...]:
    """``_implicit_cvt`` and ``InterpretedFunction.run`` that type an int argument of a parameter annotated with an
    integer type as annotated (as ``triton.runtime.jit`` does for compiled code), not by its value."""
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter as ti

    def typed_cvt(arg: Any) -> Any:
        if isinstance(arg, _AnnotatedInt):
            dtype = ti._get_np_dtype(arg.ty)
            if np.iinfo(dtype).min <= int(arg) <= np.iinfo(dtype).max:
                return tl.tensor(ti.TensorHandle(np.array([int(arg)], dtype=dtype), arg.ty), arg.ty)
        return implicit_cvt(arg)

    def typed_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        typed = _int_annotations(self.fn)

        def wrap(name: str, value: Any) -> Any:
            if name not in typed or type(value) is not int:
                return value
            out = _AnnotatedInt(value)
            out.ty = typed[name]
            return out

        args = tuple(wrap(self.arg_names[i], a) if i < len(self.arg_names) else a for i, a in enumerate(args))
        return run(self, *args, **{k: wrap(k, v) for k, v in kwargs.items()})

    return typed_cvt, typed_run


def _bf16_binary_op(original: Callable[..., Any], as_float: Callable[[Any], Any]) -> Callable[..., Any]:
    """``InterpreterBuilder.binary_op`` that applies the operator of two bfloat16 blocks to their values (in float32:
    exact for +, -, * of two bfloat16) and rounds the result once, as a GPU does; other operands as ``original``."""
    import ml_dtypes
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter as ti

    def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if lhs.dtype.scalar != tl.bfloat16 or rhs.dtype.scalar != tl.bfloat16:
            return original(self, lhs, rhs, op)
        with np.errstate(all="ignore"):  # NaN and infinity propagate, as on a GPU, without a warning
            out = op(as_float(lhs), as_float(rhs))
        if out.dtype == np.bool_:  # a comparison
            return ti.TensorHandle(out, tl.int1)
        return ti.TensorHandle(out.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)

    return binary_op


def _tensor_range(ti: Any, tl: Any, np: Any) -> Callable[..., Any]:
    """``tl.range`` whose loop variable is an int32 scalar tensor (int64 where a bound is), as compiled code's."""

    def tensor_range(arg1: Any, arg2: Any = None, step: Any = None, **_options: Any) -> Any:
        bounds = (arg1, arg2, step)
        wide = any(isinstance(b, tl.tensor) and b.dtype.scalar in (tl.int64, tl.uint64) for b in bounds)
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        values = range(int(start), int(end), 1 if step is None else int(step))
        if values and not (min(values[0], values[-1]) >= -2**31 and max(values[0], values[-1]) < 2**31):
            wide = True
        ty = tl.int64 if wide else tl.int32
        for i in values:
            yield tl.tensor(ti.TensorHandle(np.array([i], dtype=np.int64 if wide else np.int32), ty), ty)

    return tensor_range


def defects() -> list[str]:
    """The defects the interpreter shows now (with or without :func:`fix`): one probe kernel each."""
    from gmm_kernels.runtimes import triton_probes

    return [name for name in DEFECTS if not triton_probes.PROBES[name]()]


def stale_kernels(fn: Any) -> list[str]:
    """The Triton kernels that ``fn``'s module holds compiled for a GPU (``@triton.jit`` ran before
    ``TRITON_INTERPRET=1`` was set), where the interpreter is in use: calling them raises ``0 active drivers``."""
    if not _loaded() or not in_use():
        return []
    from triton.runtime.jit import JITFunction, KernelInterface

    namespace = getattr(inspect.unwrap(fn), "__globals__", None) if callable(fn) else None
    stale = []
    for name, value in (namespace or {}).items():
        inner = value
        while isinstance(inner, KernelInterface) and not isinstance(inner, JITFunction) and hasattr(inner, "fn"):
            inner = inner.fn  # an autotuner's or heuristics' wrapped kernel
        if isinstance(inner, JITFunction):
            stale.append(name)
    return sorted(stale)


def _kernels_of(fn: Any) -> list[tuple[str, str]]:
    """(name, source) of each ``@triton.jit`` function ``fn``'s module, or a module it holds, binds (compiled or
    interpreted, unwrapped from an autotuner)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, KernelInterface

    namespace = getattr(inspect.unwrap(fn), "__globals__", None) if callable(fn) else None
    spaces = [namespace or {}]
    spaces += [vars(v) for v in (namespace or {}).values() if inspect.ismodule(v) and not v.__name__.startswith(
        ("triton", "torch", "jax", "numpy"))]
    found = []
    for value in (v for space in spaces for v in list(space.values())):
        while isinstance(value, KernelInterface) and not isinstance(value, (JITFunction, InterpretedFunction)) \
                and hasattr(value, "fn"):
            value = value.fn
        if isinstance(value, (JITFunction, InterpretedFunction)):
            try:
                source = getattr(value, "src", None) or inspect.getsource(value.fn)
            except (OSError, TypeError):
                source = ""
            found.append((getattr(value.fn, "__name__", "?"), source))
    return found


#: a Triton feature a kernel's source may use that the installed Triton may have removed: (what to look for, its
#: name, what replaces it)
_REMOVED = ((re.compile(r"\bmake_block_ptr\b|\btl\.advance\b"), "block pointers (tl.make_block_ptr, tl.advance)",
             "tl.make_tensor_descriptor"),)


def removed_features(fn: Any) -> list[str]:
    """Why ``fn``'s Triton kernels cannot run with the installed Triton: each feature their source uses that it
    removed (block pointers, gone in Triton 3.9), naming the kernels; empty where none."""
    if not _loaded():
        return []
    import triton.language as tl

    out = []
    for pattern, what, instead in _REMOVED:
        if "removed" not in (tl.make_block_ptr.__doc__ or ""):  # this Triton still has them
            continue
        users = sorted({name for name, source in _kernels_of(fn) if pattern.search(source)})
        if users:
            out.append(f"{', '.join(users)} use{'s' * (len(users) == 1)} {what}, which Triton {_version()} (installed "
                       f"here) removed in favour of {instead}: check it with a Triton that has them (3.6 and "
                       f"earlier, as on a GPU machine), or port it")
    return out


def reaches_triton_kernels(fn: Any) -> bool:
    """Whether ``fn`` can launch a Triton kernel: its module, or a module it holds (``from . import kernels``), binds
    a ``@triton.jit`` function (an autotuned or heuristics-wrapped one too). Where the interpreter is in use such a
    user's kernel runs interpreted, and is checked as the built-in interpreted kernels are."""
    if not _loaded():
        return False
    from triton.runtime.jit import KernelInterface

    namespace = getattr(inspect.unwrap(fn), "__globals__", None) if callable(fn) else None
    spaces = [namespace or {}]
    spaces += [vars(v) for v in (namespace or {}).values() if inspect.ismodule(v) and not v.__name__.startswith(
        ("triton", "torch", "jax", "numpy"))]
    return any(isinstance(v, KernelInterface) for space in spaces for v in list(space.values()))


def ready(fn: Any = None) -> None:
    """Make a resolved kernel runnable here: :func:`fix` the interpreter (where Triton is imported and the
    interpreter in use), and refuse a function whose module's Triton kernels were compiled for a GPU
    (:func:`stale_kernels`) with the error :func:`explain` gives, before any check runs. An unverified Triton
    is probed for a user's function only (``fn``), never for a built-in adapter that merely runs where a
    library imported Triton."""
    if fn is not None or (_loaded() and _version() in VERIFIED):
        fix()
    removed = removed_features(fn)
    if removed:
        raise ValueError(f"{getattr(fn, '__module__', '?')}: " + "; ".join(removed))
    stale = stale_kernels(fn)
    if stale:
        message = str(explain(RuntimeError(_NO_DRIVER)))
        raise ValueError(f"{getattr(fn, '__module__', '?')}: {', '.join(stale)}: {message}")


def explain(exc: BaseException) -> BaseException | None:
    """A clear error for a Triton kernel compiled for a GPU on a machine without one (``0 active drivers``):
    its module was imported before ``TRITON_INTERPRET=1`` was set; None for any other exception."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, RuntimeError) and _NO_DRIVER in str(seen):
            return RuntimeError(
                "a Triton kernel was compiled for a GPU, and there is none here (Triton: '0 active drivers'): its "
                "module was imported before TRITON_INTERPRET=1 was set, and @triton.jit reads it at import. Set "
                "TRITON_INTERPRET=1 in the environment before Python starts, or call "
                "gmm_kernels.runtimes.triton_interpreter.use_if_no_gpu() before importing the kernel's module, or "
                "pass the kernel as 'pkg.module:fn' (the harness then sets it before importing)")
        seen = seen.__cause__ or seen.__context__
    return None
