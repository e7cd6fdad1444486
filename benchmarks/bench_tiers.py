"""Bugs per CPU-second: what each tier costs and catches (a script, not a test; figures from one run are comparable
with each other, not across machines).

    python benchmarks/bench_tiers.py kernels   # gmm-harness check --kernel K --tier T: cold and warm, per tier
    python benchmarks/bench_tiers.py api       # the same through check_kernel(K, tier=T) in a fresh process
    python benchmarks/bench_tiers.py main      # the main job (every kernel here, goldens): cold and warm, per tier
    python benchmarks/bench_tiers.py corpus    # the broken-kernel corpus per tier: caught, CPU s, first failure
    ... --tiers gmm-quick,gmm-ci --nightly-budget 30 --with-large --conventions ragged_dot,...

``kernels`` runs the main job end to end (``gmm-harness check --kernel K --tier T``, goldens included, in a fresh
process) on three correct kernels: a jax.numpy kernel (the walk-through's, docs/check-your-kernel.md), an
interpreted Pallas kernel (megablox's own ``gmm``, ``megablox.gmm``, in Pallas interpret mode) and a torch kernel
(``torch.grouped_mm``, torch's CPU ``_grouped_mm``): "cold" with a fresh compilation cache, then "warm" with the
cache the cold run left. CPU seconds are the process tree's (``RUSAGE_CHILDREN``: XLA compiles on several
threads). ``gmm-nightly`` runs with ``--nightly-budget`` seconds of new examples (its own budget is 300 s a
kernel) and without the ``large`` mode unless ``--with-large`` (it needs several GiB: docs/coverage.md).

``api`` does the same through ``check_kernel(K, tier=T)`` in one fresh process a run (no worker process, no
goldens; the same ``--nightly-budget``, the ``large`` mode left out unless ``--with-large``).

``main`` runs the main job as CI does (``gmm-harness check --tier T``: every kernel here, the goldens, the
default ``--jobs``), cold and warm; ``gmm-nightly`` is left out unless named (its budget is 300 s a kernel).

``corpus`` runs, per tier, every broken kernel of ``tests/corpus/broken_kernels.py`` (``BROKEN`` and
``BROKEN_GRADIENTS``) through ``check_kernel(..., tier=T)`` in one process per tier, the modes in ``RUN_ORDER``
(the main job's order), stopping at the first failure (``raise_on_failure``), and prints how many it caught,
the CPU and wall seconds, and the time from the call to the first failure reported (shrunk, with its
reproducer), and the time to the first failing example said (``gmm-harness: FOUND``, before shrinking: the
``gmm_harness`` logger's first record). A kernel whose convention cannot run here is left out and named.
``gmm-nightly``'s first round is ``gmm-ci``'s run, so a broken kernel it catches it catches there: it is
measured only when named in ``--tiers``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the walk-through's kernel (docs/check-your-kernel.md, step 2): a jax.numpy ragged_dot
JNP_KERNEL = '''import jax.numpy as jnp

import gmm_kernels


@gmm_kernels.declare("ragged_dot", dtypes=["float32", "bfloat16"])
def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    out_dtype = preferred_element_type or lhs.dtype
    lhs, rhs = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32)
    ends = jnp.cumsum(jnp.asarray(group_sizes))
    group = jnp.searchsorted(ends, jnp.arange(lhs.shape[0]), side="right")
    weights = rhs[jnp.minimum(group, rhs.shape[0] - 1)]
    out = jnp.einsum("mk,mkn->mn", lhs, weights, precision="highest")
    out = jnp.where((group < rhs.shape[0])[:, None], out, 0.0)
    return out.astype(out_dtype)
'''
KERNELS = {"jax.numpy (walk-through)": "walkthrough_kernels.gmm:ragged_dot", "interpreted Pallas (megablox.gmm)":
           "megablox.gmm", "torch (torch.grouped_mm)": "torch.grouped_mm"}

# in a fresh process: check_kernel on one kernel under one tier
API = '''
import json, os, sys
from gmm_kernels.runtimes.process import prepare_process
prepare_process()
sys.path.insert(0, os.getcwd())
from property_tests.checks.check import check_kernel
kernel, tier, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
modes = sys.argv[4].split(",") if sys.argv[4] else None
report = check_kernel(kernel, tier=tier, budget=budget if tier == "gmm-nightly" else None, modes=modes)
(run, cells), (reached, pairs) = report.reached()
print(json.dumps({"summary": report.summary(), "reached": f"{run} of {cells} cells, {reached} of {pairs} pairs"}))
'''

# in a fresh process: each broken kernel under one tier, a JSON line each
CORPUS = '''
import json, os, sys, time
from gmm_kernels.runtimes.process import prepare_process
prepare_process()
import logging
import gmm_ref
from property_tests.checks.check import check_kernel
from property_tests.checks.failures import LOGGER
said = []
class _Said(logging.Handler):
    def emit(self, record):
        said.append(time.perf_counter())
LOGGER.addHandler(_Said())
LOGGER.propagate = False
from property_tests.checks.engine import run_rank
from property_tests.checks.modes import MODES
from tests.corpus.broken_kernels import BROKEN, BROKEN_GRADIENTS
tier, wanted = sys.argv[1], set(sys.argv[2].split(",")) if sys.argv[2] else None
order = sorted(MODES, key=run_rank)
for group in (BROKEN, BROKEN_GRADIENTS):
    for convention, fns in group.items():
        if wanted is not None and convention not in wanted:
            continue
        for fn in fns:
            line = {"convention": convention, "kernel": fn.__name__}
            try:
                __import__(gmm_ref.conventions.get(convention).framework)
            except ImportError as exc:
                print(json.dumps({**line, "left_out": str(exc)}), flush=True)
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            said.clear()
            try:
                check_kernel(fn, convention=convention, tier=tier, modes=order)
                line["caught"] = None
            except ValueError as exc:
                line["left_out"] = str(exc)[:200]
            except Exception as exc:
                line["caught"] = type(exc).__name__ + ": " + str(exc).splitlines()[0][:120]
            line.update(wall=time.perf_counter() - t0, cpu=time.process_time() - c0,
                        said=said[0] - t0 if said else None)
            print(json.dumps(line), flush=True)
'''


def _env(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    env.pop("GMM_HARNESS_EXAMPLE_DB", None)
    return {**env, "PYTHONPATH": str(ROOT), "GMM_HARNESS_COMPILE_CACHE": cache, "XDG_CACHE_HOME": cache + "-xdg"}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU seconds (the process tree's) of ``cmd``, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def _line(out: str, marker: str) -> str:
    return next((ln.strip() for ln in out.splitlines() if marker in ln), "?")


def bench_kernels(args: argparse.Namespace) -> None:
    work = _work()
    print("| kernel | tier | run | wall s | CPU s | result | reached |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, kernel in KERNELS.items():
        for tier in args.tiers:
            extra = []
            if tier == "gmm-nightly":
                extra = ["--budget", str(args.nightly_budget)]
                if not args.with_large:
                    extra += ["--modes", ",".join(_default_modes())]
            cache = tempfile.mkdtemp(prefix="gmm-cache-")
            for run in ("cold", "warm"):
                cmd = [sys.executable, "-m", "property_tests.cli.main", "check", "--kernel", kernel, "--tier", tier,
                       "--jobs", "1", *extra]
                wall, cpu, proc = _run(cmd, work, _env(cache))
                result = _line(proc.stdout, " passed, ").split("(")[0].strip() + f" (exit {proc.returncode})"
                reached = _line(proc.stdout, " reached ").replace(f"tier {tier} reached ", "").split(" (docs")[0]
                print(f"| {label} | {tier} | {run} | {wall:.1f} | {cpu:.1f} | {result} | {reached} |", flush=True)
                if proc.returncode not in (0, 1):
                    print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)


def bench_api(args: argparse.Namespace) -> None:
    work = _work()
    print("| kernel | tier | run | wall s | CPU s | result | reached |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, kernel in KERNELS.items():
        for tier in args.tiers:
            modes = ",".join(_default_modes()) if tier == "gmm-nightly" and not args.with_large else ""
            cache = tempfile.mkdtemp(prefix="gmm-cache-")
            for run in ("cold", "warm"):
                cmd = [sys.executable, "-c", API, kernel, tier, str(args.nightly_budget), modes]
                wall, cpu, proc = _run(cmd, work, _env(cache))
                doc = json.loads(_line(proc.stdout, '{"summary"')) if proc.returncode == 0 else {}
                result = doc.get("summary", f"exit {proc.returncode}")
                print(f"| {label} | {tier} | {run} | {wall:.1f} | {cpu:.1f} | {result} | {doc.get('reached', '?')} |",
                      flush=True)
                if proc.returncode:
                    print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)


def bench_main(args: argparse.Namespace) -> None:
    print("| tier | run | wall s | CPU s | result | reached |")
    print("| --- | --- | --- | --- | --- | --- |")
    for tier in args.tiers:
        cache = tempfile.mkdtemp(prefix="gmm-cache-")
        for run in ("cold", "warm"):
            cmd = [sys.executable, "-m", "property_tests.cli.main", "check", "--tier", tier]
            wall, cpu, proc = _run(cmd, ROOT, _env(cache))
            result = _line(proc.stdout, " passed, ").split("(")[0].strip() + f" (exit {proc.returncode})"
            reached = _line(proc.stdout, " reached ").replace(f"tier {tier} reached ", "").split(" (docs")[0]
            print(f"| {tier} | {run} | {wall:.0f} | {cpu:.0f} | {result} | {reached} |", flush=True)
            if proc.returncode:
                print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)


def _work() -> Path:
    """A directory holding the walk-through's kernel module (``walkthrough_kernels.gmm``)."""
    work = Path(tempfile.mkdtemp(prefix="gmm-bench-tiers-"))
    (work / "walkthrough_kernels").mkdir()
    (work / "walkthrough_kernels" / "__init__.py").write_text("")
    (work / "walkthrough_kernels" / "gmm.py").write_text(JNP_KERNEL)
    return work


def _default_modes() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from property_tests.checks.modes import MODES

    return list(MODES)


def bench_corpus(args: argparse.Namespace) -> None:
    print("| tier | caught | CPU s | wall s | first failure, median / max s | first said, median / max s | within 10 s"
          " (said / reported) | not caught |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tier in args.tiers:
        cache = tempfile.mkdtemp(prefix="gmm-cache-")
        cmd = [sys.executable, "-c", CORPUS, tier, args.conventions or ""]
        wall, cpu, proc = _run(cmd, ROOT, _env(cache))
        rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if args.jsonl:
            with open(args.jsonl, "a") as out:
                out.writelines(json.dumps({"tier": tier, **r}) + "\n" for r in rows)
        run = [r for r in rows if "left_out" not in r]
        caught = [r for r in run if r["caught"]]
        firsts = [r["wall"] for r in caught]
        missed = ", ".join(f"{r['convention']}:{r['kernel']}" for r in run if not r["caught"]) or "none"
        left = [f"{r['kernel']} ({r['left_out'][:60]})" for r in rows if "left_out" in r]
        share = f"{len(caught)}/{len(run)} ({100 * len(caught) / max(len(run), 1):.0f} %)"
        times = f"{statistics.median(firsts):.1f} / {max(firsts):.1f}" if firsts else "-"
        # the first failing example said (gmm_harness log, before shrinking); the report itself where none was
        saids = [r["said"] if r.get("said") is not None else r["wall"] for r in caught]
        said = f"{statistics.median(saids):.1f} / {max(saids):.1f}" if saids else "-"
        within = f"{sum(s <= 10 for s in saids)} / {sum(f <= 10 for f in firsts)} of {len(caught)}"
        print(f"| {tier} | {share} | {cpu:.0f} | {wall:.0f} | {times} | {said} | {within} | {missed} |", flush=True)
        if left:
            print(f"left out under {tier}: {'; '.join(left)}", file=sys.stderr)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("what", choices=["kernels", "api", "main", "corpus"])
    parser.add_argument("--tiers", default="gmm-quick,gmm-ci,gmm-nightly", help="comma-separated tiers")
    parser.add_argument("--nightly-budget", type=float, default=30.0,
                        help="kernels: gmm-nightly's --budget seconds (its own: 300)")
    parser.add_argument("--with-large", action="store_true", help="kernels: gmm-nightly runs the large mode too")
    parser.add_argument("--conventions", default=None, help="corpus: only these conventions (comma-separated)")
    parser.add_argument("--jsonl", default=None, help="corpus: append every kernel's line to this file")
    args = parser.parse_args()
    args.tiers = args.tiers.split(",")
    if args.what in ("corpus", "main") and args.tiers == ["gmm-quick", "gmm-ci", "gmm-nightly"]:
        args.tiers = ["gmm-quick", "gmm-ci"]  # gmm-nightly: gmm-ci's run, then its budget (see the docstring)
    {"kernels": bench_kernels, "api": bench_api, "main": bench_main, "corpus": bench_corpus}[args.what](args)


if __name__ == "__main__":
    main()
