"""``python -m golden``: regenerate, verify, check and list goldens, from any working directory.

Without ``--dir`` it works on this project's own goldens (``golden/data``,
installed with the package) and corpus (``golden.cases``). With ``--dir PATH``
it serves any golden directory, a downstream repository's own included; its
corpus comes from ``--corpus pkg.module:CASES`` (or a manifest), else from the
directory's manifest. docs/goldens.md documents the case format.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import gmm_ref
from gmm_kernels import configure, load_object, resolve_kernel
from gmm_kernels.runtimes.process import prepare_process
from gmm_kernels.sandbox import device
from gmm_ref.routed.routing import parse_declared_numerics
from golden.case import Case, GoldenError, select
from golden.cases import CASES
from golden.judge import check_goldens, out_of_scope, reasons_text, scope_reasons
from golden.regeneration import regenerate
from golden.staleness import by_convention, contents
from golden.store import PROG, GoldenStore, corpus_of, default_directory, read_manifest
from golden.verification import verify

__all__ = ["default_directory", "load_corpus", "main", "summary"]

def load_corpus(spec: str) -> list[Case]:
    """Cases from ``pkg.module:NAME`` (a list of Case or their JSON, or a function returning one),
    a ``manifest.json`` or a golden directory."""
    if spec.endswith(".json") or os.path.isdir(spec):
        path = Path(spec)
        return GoldenStore(path).corpus() if path.is_dir() else corpus_of(read_manifest(path))
    obj = load_object(spec, option="--corpus")
    obj = obj() if callable(obj) else obj
    return [c if isinstance(c, Case) else Case.from_json(c) for c in obj]


def summary(corpus: Sequence[Case]) -> str:
    """Counts of cases per convention, family, dtype and tag."""
    def count(key: Callable[[Case], Iterable[str]]) -> str:
        cnt: Counter[str] = Counter()
        for c in corpus:
            cnt.update(key(c))
        return ", ".join(f"{k} {v}" for k, v in sorted(cnt.items()))

    return "\n".join([
        f"{len(corpus)} cases",
        "conventions: " + count(lambda c: [c.convention]),
        "families:    " + count(lambda c: [c.family]),
        "dtypes:      " + count(lambda c: [c.dtype]),
        "edge tags:   " + count(lambda c: c.tags),
    ])


def _parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Golden outputs for grouped-GEMM kernels.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--dir", default=None, help="golden directory (default: this project's golden data)")
        sp.add_argument("--cases", default=None, help="comma-separated glob(s) of case names")
        sp.add_argument("--corpus", default=None,
                        help="'pkg.mod:CASES' or a manifest.json/directory whose specs to use")

    def kernel_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--kernel", default=None,
                        help="a built-in kernel name (gmm_kernels.registry()) or 'pkg.module:function'")
        sp.add_argument("--convention", default=None,
                        choices=[*gmm_ref.conventions.names(), *gmm_ref.conventions.routed_names()],
                        help="the calling convention of a 'pkg.module:function' kernel")
        sp.add_argument("--numerics", default=None, metavar="SPEC",
                        help="the kernel's arithmetic: accumulate=DTYPE[,multiply=DTYPE][,flush]; a routed "
                             "function's also [,weight=accumulator|output|DTYPE][,combine=accumulator|DTYPE] "
                             "(default: its adapter's, or docs/numerics.md's default for a function)")
        sp.add_argument("--kernel-version", default=None,
                        help="version recorded for the kernel (goldens match bit for bit only on the same one)")
        sp.add_argument("--device", default=None, metavar="auto|cpu|cuda|cuda:N",
                        help="the device a torch-convention kernel runs on (default: auto, CUDA where torch sees a "
                             "GPU, else cpu; gmm_kernels.sandbox.device)")

    sp = sub.add_parser("regenerate", help="recompute goldens (reference, or --kernel)")
    common(sp)
    kernel_opts(sp)
    sp.add_argument("--update", action="store_true", help="allow changing existing goldens")
    sp.add_argument("--wait", type=float, default=600.0,
                    help="seconds to wait for another regeneration's lock on the directory (0: do not wait)")
    sp.add_argument("--store-inputs", action="store_true", help="also store the (recomputable) inputs")
    sp.add_argument("--drop-stale", action="store_true",
                    help="remove the kernel goldens of the selected cases made from another version of their case")
    common(sub.add_parser("verify", help="hashes, manifest consistency, reference reproduces its goldens"))
    sp = sub.add_parser("check", help="kernels against the goldens of their convention")
    common(sp)
    kernel_opts(sp)
    common(sub.add_parser("list", help="the corpus' cases"))
    return ap


def _kernel(args: argparse.Namespace) -> Any:
    if not args.kernel:
        return None
    kernel = resolve_kernel(args.kernel, convention=args.convention)
    return configure(kernel, numerics=parse_declared_numerics(args.numerics), version=args.kernel_version or None)


def _nothing_checked(kernel: Any, directory: Path, cases: str | None, results: list[Any]) -> str:
    """Why a check checked nothing: what the directory holds, and what the kernel would need."""
    store = GoldenStore(directory)
    if not store.manifest_path.exists():
        return f"{directory} has no manifest.json: no golden there"
    held = contents(store.manifest()["cases"])
    sel = f" matching --cases {cases}" if cases else ""
    if results:
        who = f"{kernel.name}'s scope" if kernel is not None else "the scope of every kernel here"
        reasons = reasons_text(scope_reasons(results))
        return f"all {len(results)} golden case(s){sel} in {directory} are out of {who}: {reasons}"
    if kernel is None:
        return f"no kernel here has goldens of its convention{sel} in {directory} (it holds {held})"
    return f"{directory} holds {held}; none{sel} of {kernel.name}'s convention, {kernel.convention}"


def _check(args: argparse.Namespace, directory: Path, corpus: list[Case] | None, where: str, prog: str
           ) -> tuple[int, str]:
    """Exit 1 if a case failed, 2 if nothing was checked (no golden of the kernel's convention, or every one out
    of its scope): checking nothing is an error, as in the main job."""
    import gmm_kernels

    kernel = _kernel(args)
    kernels = [kernel] if kernel is not None else gmm_kernels.registry()
    require_own = bool(args.kernel_version)
    results = [r for k in kernels for r in check_goldens(k, directory, cases=args.cases, require_own=require_own,
                                                          corpus=corpus, where=where)]
    counts = {s: sum(r.status is s for r in results) for s in gmm_kernels.Status}
    if len(results) == counts[gmm_kernels.Status.UNSUPPORTED]:
        why = _nothing_checked(kernel, directory, args.cases, results)
        return 2, "".join(r.line() + "\n" for r in results) + f"{prog} check: error: nothing checked: {why}"
    text = "\n".join(r.line() for r in results)
    text += "\n" + ", ".join(f"{v} {s.name.lower().replace('_', ' ')}" for s, v in counts.items())
    scope = out_of_scope(results)
    text += f" ({scope})" if scope else ""
    return (1 if counts[gmm_kernels.Status.FAILED] else 0), text


def _list(args: argparse.Namespace, corpus: list[Case] | None, directory: Path) -> tuple[int, str]:
    if corpus is None and not directory.is_dir():
        raise GoldenError(f"--dir {directory}: no such directory")
    cor = corpus if corpus is not None else load_corpus(str(directory))
    chosen = [c for c in cor if c.name in set(select([c.name for c in cor], args.cases))]
    if args.cases and not chosen:
        raise GoldenError(f"--cases {args.cases} matches no case (the corpus holds "
                          f"{by_convention(c.convention for c in cor)})")
    lines = [f"{c.name:<44} {c.convention:<18} {c.family:<9} {c.dtype:<9} {' '.join(c.tags)}" for c in chosen]
    print(summary(chosen), file=sys.stderr)
    return 0, "\n".join(lines)


def _run(args: argparse.Namespace, corpus: list[Case] | None, directory: Path, where: str, prog: str
         ) -> tuple[int, str]:
    if args.cmd == "list":
        return _list(args, corpus, directory)
    if args.cmd == "regenerate":
        return regenerate(corpus, directory, kernel=_kernel(args), convention=args.convention, cases=args.cases,
                          update=args.update, store_inputs=args.store_inputs, command=prog, where=where,
                          wait=args.wait, drop_stale=args.drop_stale)
    if args.cmd == "verify":
        return verify(directory, corpus, cases=args.cases, command=prog, where=where)
    return _check(args, directory, corpus, where, prog)


def main(argv: Sequence[str] | None = None, *, corpus: Sequence[Case] | None = None,
         default_dir: str | os.PathLike[str] | None = None, prog: str = PROG) -> int:
    """The golden command line. ``corpus`` / ``default_dir`` replace the defaults (this project's
    corpus and golden data when no ``--dir`` is given; the directory's own manifest with one)."""
    args = _parser(prog).parse_args(argv)
    where = (f" --dir {args.dir}" if args.dir else "") + (f" --corpus {args.corpus}" if args.corpus else "")
    directory = Path(args.dir or default_dir or default_directory())
    try:
        if getattr(args, "device", None) is not None:  # the commands that run a kernel; a ValueError names it
            device.select(args.device, option="--device")
        # Triton's interpreter where no GPU is seen, before any kernel library imports triton (ejkernel does): its
        # own @triton.jit helpers are made for the GPU otherwise, and every interpreted kernel fails
        prepare_process(host=False)
        if args.corpus:
            cor = load_corpus(args.corpus)
        elif corpus is not None:
            cor = list(corpus)
        elif args.dir or default_dir:
            cor = None
        else:
            cor = list(CASES)
        rc, text = _run(args, cor, directory, where, prog)
    except (GoldenError, ValueError, TypeError, ImportError, AttributeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(text, file=sys.stdout if rc == 0 else sys.stderr)
    return rc
