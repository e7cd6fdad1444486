"""Every way a worker of the main job can end ends in a named verdict, and the run goes on.

The main job computes its cells in worker processes (``property_tests.cli.worker``,
watched by ``property_tests.cli.supervisor.Supervisor``). A worker that ends before it
reported all its cells has crashed, whatever its exit status: an exit with
status 0 (``os._exit(0)``), a signal, an exception that escapes a cell or the
worker's own setup, a kernel whose ``sys.exit`` would end it. A worker must
also end after its last cell (a kernel may leave threads running) and report
with its stdout and stderr closed; a worker that hangs is killed. These tests
assert verdicts and exit statuses, never durations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from property_tests.checks.engine import RUN_ORDER
from property_tests.cli import worker
from property_tests.cli.request import WorkerEvent, WorkRequest
from property_tests.cli.supervisor import Supervisor
from property_tests.cli.table import Table

ROOT = Path(__file__).resolve().parents[2]
#: seconds a whole main job may take before the test fails (a hang of the old supervisor ends here)
JOB_LIMIT = 480
KERNELS = textwrap.dedent('''
    import os, signal, sys, threading, time
    import numpy as np
    import gmm_ref

    CALLS = [0]

    def _right(lhs, rhs, group_sizes, preferred_element_type):
        return gmm_ref.ragged_dot(np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes),
                                  preferred_element_type=preferred_element_type)

    def _nth(n):
        CALLS[0] += 1
        return CALLS[0] >= n

    class Stop(BaseException):
        """not an Exception: what a kernel-call wrapper catching Exception lets through"""

    def good(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def exits_0(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if _nth(5):
            os._exit(0)  # what a native library does on an internal error
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def sys_exit_0(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if _nth(3):
            sys.exit(0)
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def raises_base_exception(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if _nth(3):
            raise Stop("out of here")
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def sigkill(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if _nth(3):
            os.kill(os.getpid(), signal.SIGKILL)
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def sigsegv(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if _nth(3):
            os.kill(os.getpid(), signal.SIGSEGV)
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def leaves_a_thread(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if CALLS[0] == 0:  # a non-daemon thread that outlives the kernel (and the worker's last cell)
            threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
        CALLS[0] += 1
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def closes_fds(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if CALLS[0] == 0:
            os.close(1)
            os.close(2)
        CALLS[0] += 1
        return np.zeros((1, 2, 3))  # wrong: the report must still come

    def closes_streams(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        sys.stdout.close()
        sys.stderr.close()
        return np.zeros((1, 2, 3))

    def hangs(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        time.sleep(3600)

    from gmm_kernels import KernelAdapter

    class SigsegvInItsWorker(KernelAdapter):
        """an adapter class: it runs in the worker's own process, which its crash ends"""
        name = "ends:SigsegvInItsWorker"
        convention = "ragged_dot"

        def call(self, lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
            return sigsegv(lhs, rhs, group_sizes, precision, preferred_element_type)
''')
#: a kernel module that imports in the main job but not for a worker (its setup fails outside any cell); it is
#: imported in a process of its own, started by the one it refuses
WORKER_ONLY_FAILURE = textwrap.dedent('''
    import os, sys
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        if b"property_tests.cli.worker" in f.read() or sys.argv[0].endswith("worker.py"):
            raise RuntimeError("this module refuses to load in a worker")

    def good(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        import ends
        return ends.good(lhs, rhs, group_sizes, precision, preferred_element_type)
''')
OPTIONS = ["--convention", "ragged_dot", "--modes", "exact,normal", "--max-examples", "3", "--no-goldens"]


def _main_job(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """The main job as a user runs it, from a directory of their own holding the kernel modules."""
    (cwd / "ends.py").write_text(KERNELS)
    (cwd / "worker_only_failure.py").write_text(WORKER_ONLY_FAILURE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    env.pop("GMM_HARNESS_EXAMPLE_DB", None)
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", *argv], capture_output=True,
                          text=True, timeout=JOB_LIMIT, cwd=cwd, env=env)


def _row(out: str, kernel: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(kernel + " "))


def _notes(out: str) -> dict[str, str]:
    """The table's footnotes by number."""
    return {line.split("]", 1)[0][1:]: line.split("] ", 1)[1] for line in out.splitlines()
            if line.startswith("[") and "] " in line}


def _cells(out: str, kernel: str) -> list[str]:
    """A kernel's cells (exact, normal), each a footnote's text or the cell itself."""
    notes = _notes(out)
    header = [c.strip() for c in next(line for line in out.splitlines() if line.startswith("kernel ")).split("|")]
    row = [c.strip() for c in _row(out, kernel).split("|")]
    cells = [c for h, c in zip(header, row, strict=True) if h not in ("kernel", "family", "device")]  # the modes'
    return [notes[c.split("[")[1].rstrip("]")] if c.endswith("]") else c for c in cells]


ENDINGS = ["exits_0", "sys_exit_0", "raises_base_exception", "sigkill", "sigsegv", "leaves_a_thread", "closes_fds",
           "closes_streams", "SigsegvInItsWorker"]


@pytest.fixture(scope="module")
def endings(tmp_path_factory):
    """One main job over a kernel per way of ending (two lanes), beside a good kernel."""
    d = tmp_path_factory.mktemp("endings")
    kernels = [a for k in [*ENDINGS, "good"] for a in ("--kernel", f"ends:{k}")]
    kernels += ["--kernel", "worker_only_failure:good"]
    return _main_job(d, *kernels, *OPTIONS, "--jobs", "2", "--timeout", "300")


@pytest.mark.slow
def test_the_run_ends_with_every_kernel_in_the_table(endings):
    out = endings.stdout
    assert endings.returncode == 1, endings.stdout[-3000:] + endings.stderr[-3000:]
    for k in [*ENDINGS, "good"]:
        assert _row(out, f"ends:{k}"), k
    assert _cells(out, "ends:good") == ["pass (3; 1/62 cells)"] * 2


#: a kernel named by its import path runs in a process of its own (gmm_kernels.sandbox.host): its end is the cell's
#: crash, and the worker goes on; an adapter class runs in the worker, whose end the supervisor reports
CRASHES = [
    ("exits_0", "FAIL: crashed: the kernel's process exited with status 0 during the call; the last problem it was "
                "given: ragged_m "),
    ("sigkill", "FAIL: crashed: the kernel's process was killed by SIGKILL during the call; the last problem it was "
                "given: ragged_m "),
    ("sigsegv", "FAIL: crashed: the kernel's process was killed by SIGSEGV during the call; the last problem it was "
                "given: ragged_m "),
    ("SigsegvInItsWorker", "FAIL: crashed: the process was killed by SIGSEGV; the last problem it was given: "
                           "ragged_m "),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "verdict"), CRASHES, ids=[k for k, _ in CRASHES])
def test_a_worker_that_ends_before_its_last_cell_crashed_in_the_next_one(endings, kernel, verdict):
    cells = _cells(endings.stdout, f"ends:{kernel}")
    crashed = [c for c in cells if c.startswith("FAIL")]
    assert crashed and all(c.startswith(verdict) for c in crashed), cells
    assert all(c.startswith(("pass", "FAIL")) for c in cells), cells  # each cell has its verdict
    assert "convention=ragged_dot" in crashed[0] and "group_sizes=[" in crashed[0]


@pytest.mark.slow
def test_a_base_exception_from_a_kernel_in_its_own_process_is_its_failure(endings):
    # not an Exception, it ends the call in the kernel's process; the judge gets it by name, as an error of the kernel
    cells = _cells(endings.stdout, "ends:raises_base_exception")
    assert all(c.startswith(("FAIL", "INTERMITTENT")) for c in cells), cells
    assert any("Stop: out of here" in c for c in cells), cells


@pytest.mark.slow
def test_a_kernel_calling_sys_exit_fails_the_example_naming_system_exit(endings):
    cells = dict(zip(("exact", "normal"), _cells(endings.stdout, "ends:sys_exit_0"), strict=True))  # table order
    first, then = sorted(cells, key=RUN_ORDER.index)  # the order they ran in: the first reports the exception
    assert cells[first].startswith("FAIL: KernelExit: the kernel raised SystemExit(0) (sys.exit) [on ragged_m"), cells
    assert cells[then].startswith("FAIL: raised again in 3 of 3 examples"), cells  # the worker went on to the next


@pytest.mark.slow
def test_a_kernel_whose_threads_outlive_it_does_not_keep_its_worker_alive(endings):
    # the run ended; the call that started the thread is TAMPERED naming it (a thread left running after a call is
    # a failure: docs/threat-model.md), the cells after it pass
    cells = _cells(endings.stdout, "ends:leaves_a_thread")
    tampered = [c for c in cells if c.startswith("TAMPERED: kernel ends:leaves_a_thread tampered with the harness "
                                                  "during its call: started thread 'Thread-1 (sleep)'")]
    assert len(tampered) >= 1 and set(cells) - set(tampered) <= {"pass (3; 1/62 cells)"}, cells


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["closes_fds", "closes_streams"])
def test_a_kernel_that_closes_stdout_and_stderr_is_still_reported(endings, kernel):
    cells = _cells(endings.stdout, f"ends:{kernel}")
    assert cells[0].startswith("FAIL: shape/dtype"), cells  # its mismatch, found and reported
    assert cells[1].startswith("FAIL: raised again") or cells[1].startswith("FAIL: shape/dtype"), cells


@pytest.mark.slow
def test_an_exception_in_the_workers_setup_is_named_and_bounded(endings):
    cells = _cells(endings.stdout, "worker_only_failure:good")
    assert cells[0] == ("FAIL: crashed: the worker failed before it began the cell: RuntimeError: this module "
                        "refuses to load in a worker"), cells
    # the same failure in the next worker: MAX_LOST cells, then the rest is not run (never a loop)
    assert cells[1] == cells[0] or cells[1].startswith("n/a: not run: worker_only_failure:good crashed"), cells


@pytest.mark.slow
def test_the_timeout_fires_for_a_hung_kernel(tmp_path):
    proc = _main_job(tmp_path, "--kernel", "ends:hangs", *OPTIONS, "--timeout", "3")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = _cells(proc.stdout, "ends:hangs")
    assert cells[0].startswith("FAIL: timed out after 3 s"), cells
    assert cells[1].startswith(("FAIL: timed out after 3 s", "n/a: not run: ends:hangs crashed or hung in 2")), cells


# ------------------------------------------------ the supervisor, with stand-in workers (no kernel, no jax)

STAND_IN = textwrap.dedent('''
    import json, signal, sys, time
    request, events = json.load(open(sys.argv[1])), open(sys.argv[2], "a")
    how = request["kernels"][0]

    def emit(**event):
        events.write(json.dumps(event) + "\\n")
        events.flush()

    if how == "garbage":
        events.write("not json\\n{\\"event\\": \\"cell\\"}\\n")
        events.flush()
    if how in ("done_then_linger", "done_without_end"):
        for k, f, c in request["cells"]:
            emit(event="start", cell=[k, f, c], extra=False)
            emit(event="cell", cell=[k, f, c], outcome={"status": "pass", "examples": 1}, extra=False)
        if how == "done_then_linger":
            emit(event="end")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    if how == "silent":
        time.sleep(3600)
    sys.exit(0)
''')
CELLS = [("k", "ragged_m", "exact"), ("k", "ragged_m", "normal"), ("k", "ragged_m", "wide")]


def _supervise(tmp_path, monkeypatch, how: str, command: tuple[str, ...] | None = None, *, idle: float = 600,
               grace: float = 600) -> Table:
    """Supervise the three CELLS with a stand-in worker behaving as ``how`` says. Only the limit a test is about is
    short (``idle``: a silent worker; ``grace``: one that is done), so that no verdict depends on the machine's
    speed."""
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    monkeypatch.setattr(Supervisor, "COMMAND", command or (sys.executable, str(tmp_path / "stand_in.py")))
    monkeypatch.setattr(Supervisor, "MIN_IDLE", idle)
    monkeypatch.setattr(Supervisor, "EXIT_GRACE", grace)
    table = Table()
    table.plan(CELLS)
    Supervisor(WorkRequest(kernels=(how,)), table, timeout=min(idle, 600), verbose=False).run(list(CELLS))
    return table


def _texts(table: Table) -> list[str]:
    return [o.text if (o := table.rows[("k", "ragged_m")].get(c)) else "" for _, _, c in CELLS]


@pytest.mark.parametrize("how", ["exit_0", "garbage"])
def test_a_worker_that_exits_0_at_once_loses_one_cell_per_start_then_the_kernel_is_not_run(
        tmp_path, monkeypatch, how):
    texts = _texts(_supervise(tmp_path, monkeypatch, how))
    assert texts == ["FAIL: crashed: the process exited with status 0"] * 2 + [
        "n/a: not run: k crashed or hung in 2 cells already (see their notes)"], texts


def test_a_silent_worker_is_killed_and_named(tmp_path, monkeypatch):
    texts = _texts(_supervise(tmp_path, monkeypatch, "silent", idle=0.5))
    assert texts[0] == "FAIL: timed out: its worker was silent for 0.5 s before its first cell", texts
    assert texts[2].startswith("n/a: not run: k crashed or hung in 2 cells"), texts


@pytest.mark.parametrize("how", ["done_then_linger", "done_without_end"])
def test_a_worker_that_reported_every_cell_but_does_not_exit_is_done(tmp_path, monkeypatch, how):
    assert _texts(_supervise(tmp_path, monkeypatch, how, grace=0.5)) == ["pass (1)"] * 3


def test_a_worker_that_cannot_start_is_named(tmp_path, monkeypatch):
    texts = _texts(_supervise(tmp_path, monkeypatch, "exit_0", command=(str(tmp_path / "no-such-python"),)))
    assert texts[0].startswith("FAIL: crashed: its worker could not be started: [Errno 2]"), texts
    assert texts[2].startswith("n/a: not run"), texts


def test_the_worker_reports_an_error_in_its_own_setup(tmp_path):
    (tmp_path / "request.json").write_text(json.dumps({"kernels": ["no_such_kernel"], "cells": []}))
    events = tmp_path / "events.jsonl"
    assert worker.main([str(tmp_path / "request.json"), str(events)]) == 1
    (event,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert event["event"] == "error" and event["text"].startswith("ValueError: --kernel: 'no_such_kernel' is "
                                                                  "neither a built-in adapter"), event
    assert worker.describe_exception(SystemExit(0)) == "SystemExit(0)"


def test_the_protocols_records_come_back_from_json_equal():
    from gmm_kernels import Status
    from property_tests.cli.table import CellOutcome, FailedRound, GoldenTally, TableCell

    request = WorkRequest(kernels=("mod:fn",), modes=("exact", "grad"), scope={"families": "ragged_m"},
                          environ={"X": "1"}, deadline=12.5, cells=(TableCell("mod:fn", "ragged_m", "exact"),
                                                                    TableCell("mod:fn", None, "goldens")))
    back = WorkRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert back == request and back.cells[1] == ("mod:fn", None, "goldens") and back.cells[1].column == "goldens"
    outcomes = [CellOutcome(Status.FAILED, "group 0", 3, 1.5, ("report",), "cov", (2, 4), 2, False,
                            FailedRound(2, 7, 10)),
                CellOutcome(Status.PASSED, seconds=0.5, goldens=GoldenTally(4, 1, 0, 0, (("why", 3),)))]
    for o in outcomes:
        assert CellOutcome.from_json(json.loads(json.dumps(o.to_json()))) == o
    events = [WorkerEvent("start", cell=request.cells[0]), WorkerEvent("problem", kernel="mod:fn", text="G=2"),
              WorkerEvent("found", kernel="mod:fn", where="exact [ragged_m]", text="group 0: 1 wrong"),
              WorkerEvent("cell", cell=request.cells[1], outcome=outcomes[0], extra=True),
              WorkerEvent("error", text="ValueError: x", traceback="Traceback ..."), WorkerEvent("end")]
    for event in events:
        assert WorkerEvent.from_json(json.loads(json.dumps(event.to_json()))) == event
    for bad in ({"event": "cel"}, {"event": "cell", "cell": ["k"]}, {"kind": "end"}, {"event": "cell"},
                {"event": "cell", "cell": ["k", None, "exact"]}, {"event": "start"}):  # what a kernel may write
        with pytest.raises((ValueError, TypeError, KeyError)):
            WorkerEvent.from_json(bad)
    assert [o.text for o in outcomes] == ["FAIL: group 0 (round 2, seed 7, after 10 examples passed)",
                                          "pass (1/4; 3 out of scope: 3 x why)"]
