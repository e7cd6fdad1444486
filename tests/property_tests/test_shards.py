"""The main job split across machines, and failures that replay first wherever they are shared.

Two shards of a run (``--shard 1/2``, ``--shard 2/2``) check every cell of the
plan exactly once, and ``gmm-harness merge`` of their ``--json`` files prints
the table the unsharded run prints, with its exit status; a missing, repeated
or foreign shard is an error, never a pass. An example database (a directory
or a real Redis server) makes a failure found by one run the first example of
the same check in the next run that shares it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from gmm_kernels import Status, resolve_kernel
from property_tests.checks import failures
from property_tests.checks.check import check_mode
from property_tests.cli import shards
from tests.corpus import broken_kernels

ROOT = Path(__file__).resolve().parents[2]
GOOD = "tests.corpus.broken_kernels:ragged_dot_correct"
BAD = "tests.corpus.broken_kernels:ragged_dot_tail_not_zeroed"
RUN = ["--kernel", GOOD, "--kernel", BAD, "--convention", "ragged_dot", "--modes", "exact,wide,out_dtype",
       "--jobs", "1"]


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("GMM_HARNESS_EXAMPLE_DB", None)
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", *argv], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def _table(stdout: str) -> list[str]:
    """The table's rows and footnotes (what a shard run and the merge must agree on)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("kernel "))
    end = next(i for i, line in enumerate(lines) if " passed, " in line)
    return [line.rstrip() for line in lines[start:end]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One unsharded run and its two shards (sharing an example database), with their --json files."""
    d = tmp_path_factory.mktemp("shards")
    full = _cli(d, "check", *RUN, "--json", "full.json")
    parts = [_cli(d, "check", *RUN, "--shard", f"{i}/2", "--json", f"shard{i}.json", "--example-db", "db")
             for i in (1, 2)]
    return d, full, parts


@pytest.mark.slow
def test_two_shards_merged_give_the_unsharded_table_and_verdict(runs):
    d, full, parts = runs
    assert full.returncode == 1, full.stdout + full.stderr  # the broken kernel fails
    docs = [json.loads((d / f"shard{i}.json").read_text()) for i in (1, 2)]
    whole = json.loads((d / "full.json").read_text())
    keys = [{shards.plan_key((c["kernel"], c["family"], c["check"])) for c in doc["cells"]} for doc in docs]
    plan = {shards.plan_key(c) for c in whole["plan"]}
    assert keys[0] and keys[1] and not keys[0] & keys[1] and keys[0] | keys[1] == plan  # each cell exactly once
    for part, i in zip(parts, (1, 2), strict=True):
        assert part.returncode in (0, 1), part.stdout + part.stderr
        assert f"shard {i}/2: {len(keys[i - 1])} of the {len(plan)} cells" in part.stdout
    merged = _cli(d, "merge", "shard2.json", "shard1.json", "--json", "merged.json", "-v")  # any order
    assert merged.returncode == 1, merged.stdout + merged.stderr
    assert merged.stdout.startswith("merged 2 shards")
    assert _table(merged.stdout) == _table(full.stdout)
    assert merged.stdout.count("ragged_dot_tail_not_zeroed / ragged_m / exact") == 1  # the full reports follow
    doc = json.loads((d / "merged.json").read_text())
    assert [(c["kernel"], c["family"], c["check"], c["text"]) for c in doc["cells"]] == \
        [(c["kernel"], c["family"], c["check"], c["text"]) for c in whole["cells"]]
    assert doc["failed"] == whole["failed"] > 0 and doc["passed"] == whole["passed"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("edit", "text"), [
    ("drop", "missing shard 2/2 (given 1 of 2): "),
    ("twice", "shard 1/2 given twice"),
    ("foreign", "a shard of another run than"),
    ("cell lost", "1 of the plan's 8 cells is in no shard's result, e.g. "),
    ("cell twice", "was also checked by"),
    ("unsharded", "not a shard's result"),
    ("older version", "two.json: a shard's result written by another version of gmm-harness (format 1, not 2)"),
])
def test_merge_refuses_anything_but_every_shard_of_one_run(runs, edit, text):
    d = runs[0]
    one, two = (json.loads((d / f"shard{i}.json").read_text()) for i in (1, 2))
    if edit == "foreign":
        two["plan"] = two["plan"][:-1]
    elif edit == "cell lost":
        two["cells"] = two["cells"][1:]
    elif edit == "cell twice":
        two["cells"].append(one["cells"][0])
    elif edit == "older version":  # its cells' texts, not their results' fields
        del two["format"]
    case = Path(tempfile.mkdtemp(dir=d))
    (case / "one.json").write_text(json.dumps(one))
    (case / "two.json").write_text(json.dumps(two))
    files = {"drop": ["one.json"], "twice": ["one.json", "one.json"], "unsharded": [str(d / "full.json")]}
    proc = _cli(case, "merge", *files.get(edit, ["one.json", "two.json"]))
    assert proc.returncode == 2 and text in proc.stderr, proc.stdout + proc.stderr


EMPTY = ["--kernel", GOOD, "--convention", "ragged_dot", "--modes", "exact,normal", "--max-examples", "3",
         "--no-goldens", "--jobs", "1"]


@pytest.mark.slow
def test_a_shard_with_no_cells_checks_nothing_exits_0_and_merges(tmp_path):
    # exact and normal draw the same shapes: one group of cells, which shard 1/2 checks; shard 2/2 has none
    empty = _cli(tmp_path, "check", *EMPTY, "--shard", "2/2", "--json", "s2.json")
    assert empty.returncode == 0, empty.stdout + empty.stderr
    assert "shard 2/2: 0 of the 2 cells (they make 1 group of cells that compile the same shapes" in empty.stdout
    assert "shard 2/2 checked nothing (0 of the 2 cells)" in empty.stdout
    doc = json.loads((tmp_path / "s2.json").read_text())
    assert doc["shard"] == [2, 2] and doc["cells"] == [] and doc["checked"] == 0 and len(doc["plan"]) == 2
    assert (doc["passed"], doc["failed"]) == (0, 0)
    full = _cli(tmp_path, "check", *EMPTY, "--json", "full.json")
    one = _cli(tmp_path, "check", *EMPTY, "--shard", "1/2", "--json", "s1.json")
    assert full.returncode == one.returncode == 0, full.stderr + one.stderr
    merged = _cli(tmp_path, "merge", "s2.json", "s1.json", "--json", "merged/all.json")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert _table(merged.stdout) == _table(full.stdout)
    texts = [[(c["kernel"], c["family"], c["check"], c["text"]) for c in json.loads(p.read_text())["cells"]]
             for p in (tmp_path / "full.json", tmp_path / "merged" / "all.json")]
    assert texts[0] == texts[1] and len(texts[0]) == 2
    # every shard's file is needed, the empty one's too; the message counts what is missing truly
    alone = _cli(tmp_path, "merge", "s1.json")
    assert alone.returncode == 2 and "missing shard 2/2 (given 1 of 2): every cell of the plan is in the given " \
        "shards' results" in alone.stderr, alone.stderr
    alone = _cli(tmp_path, "merge", "s2.json")
    assert alone.returncode == 2 and "missing shard 1/2 (given 1 of 2): 2 of the plan's 2 cells are in no given " \
        "shard's result" in alone.stderr, alone.stderr


@pytest.mark.slow
def test_a_merged_run_that_checked_nothing_for_a_kernel_asked_for_is_an_error(tmp_path):
    # te.grouped_gemm does not run here: every cell is n/a; each shard may say so, the merge must refuse the run
    argv = ["check", "--kernel", "te.grouped_gemm", "--modes", "exact,grad", "--no-goldens"]
    for i in (1, 2):
        part = _cli(tmp_path, *argv, "--shard", f"{i}/2", "--json", f"s{i}.json")
        assert part.returncode == 0, part.stdout + part.stderr
    merged = _cli(tmp_path, "merge", "s1.json", "s2.json")
    assert merged.returncode == 2, merged.stdout + merged.stderr
    assert "--kernel: nothing was checked for te.grouped_gemm: every cell is n/a" in merged.stderr


def test_assign_deals_every_cell_once_and_balances_recorded_times():
    cells = [(f"k{k}", "ragged_m", m) for k in range(3) for m in ("exact", "wide", "grad")]
    for n in (1, 2, 3, 5):
        parts = shards.assign(cells, n)
        assert sorted(c for p in parts for c in p) == sorted(cells)
        assert all(p == [c for c in cells if c in p] for p in parts)  # each in plan order
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert parts == shards.assign(list(cells), n)  # deterministic
    # one slow cell: it gets a shard to itself, the others share the rest
    slow = {shards.plan_key(cells[4]): 100.0, **{shards.plan_key(c): 1.0 for c in cells if c != cells[4]}}
    parts = shards.assign(cells, 2, slow)
    assert [cells[4]] in parts
    # a cell missing from the durations weighs the median of the recorded ones
    parts = shards.assign(cells, 2, {shards.plan_key(cells[0]): 5.0, shards.plan_key(cells[1]): 5.0})
    assert len(parts[0]) == len(parts[1]) + 1 or len(parts[1]) == len(parts[0]) + 1


# -------------------------------------------------------------- the example database


@pytest.fixture
def redis_server(tmp_path):
    """A real Redis server for one test: (its URL, its process); skipped, with the reason, where none can be run."""
    pytest.importorskip("redis", reason="the redis package is not installed (pip install 'gmm-harness[redis]')")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("no redis-server on this machine (CI installs one with apt where it can)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    import redis

    client = redis.Redis(port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"redis-server did not answer on port {port} within 10 s")
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def redis_url(redis_server):
    return redis_server[0]


def _recording_run(spec):
    """Check the boundary-off-by-one kernel once; (result, the problems it was called on, whether each failed)."""
    calls = []

    def kernel(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        out = broken_kernels.ragged_dot_boundary_off_by_one(lhs, rhs, group_sizes, precision, preferred_element_type)
        right = broken_kernels.ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)
        calls.append(((np.asarray(lhs).copy(), np.asarray(group_sizes).copy()),
                      not np.array_equal(np.asarray(out), np.asarray(right), equal_nan=True)))
        return out

    adapter = resolve_kernel(kernel, convention="ragged_dot", name="off_by_one", option="kernel")
    return check_mode(adapter, "exact", profile="gmm-ci", example_db=spec), calls


def _same(a, b):
    return a[0].shape == b[0].shape and np.array_equal(a[0], b[0], equal_nan=True) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("where", ["directory", "redis"])
def test_a_failure_saved_by_one_run_is_the_first_failing_example_of_the_next(where, tmp_path, request):
    spec = str(tmp_path / "examples") if where == "directory" else request.getfixturevalue("redis_url")
    first, calls = _recording_run(spec)
    assert first.status is Status.FAILED
    shrunk = failures.recipe_problem(first.error, None)  # the example the report is of
    shown = (shrunk.lhs, shrunk.group_sizes)
    first_failing = next(args for args, failed in calls if failed)
    assert not _same(first_failing, shown), "precondition: the first run's first failure is not its shrunk one"
    # the next run sharing the database (another machine, a later run) meets the saved example first
    again, calls2 = _recording_run(spec)
    assert again.status is Status.FAILED
    assert _same(next(args for args, failed in calls2 if failed), shown)
    assert len(calls2) < len(calls)  # it did not search for it again
    # without the database the next run searches as the first did (the test above is not vacuous)
    control, calls3 = _recording_run("off")
    assert control.status is Status.FAILED and _same(next(args for args, failed in calls3 if failed), first_failing)


def test_each_cell_keeps_its_examples_under_a_key_of_its_own():
    from hypothesis.database import InMemoryExampleDatabase

    from property_tests.checks import example_db

    inner = InMemoryExampleDatabase()
    a, b = (example_db.for_cell(inner, f"k conv exact ragged_m cell {i}") for i in (1, 2))
    assert example_db.for_cell(None, "any") is None
    a.save(b"key", b"x")
    a.save(b"key.secondary", b"y")
    assert list(a.fetch(b"key")) == [b"x"] and list(b.fetch(b"key")) == []  # Hypothesis' key is the same for both
    a.move(b"key", b"key.pareto", b"x")
    assert list(a.fetch(b"key")) == [] and list(a.fetch(b"key.pareto")) == [b"x"]
    a.delete(b"key.secondary", b"y")
    assert list(a.fetch(b"key.secondary")) == []
    again = example_db.for_cell(inner, "k conv exact ragged_m cell 1")  # the next run's wrapper: the same key
    assert list(again.fetch(b"key.pareto")) == [b"x"]
    assert all(k.endswith(b":key.pareto") for k in inner.data if inner.data[k])


def test_cells_of_one_unit_stay_on_one_shard():
    from property_tests.cli.main import _shape_unit

    cells = [("k", "ragged_m", m) for m in ("exact", "normal", "wide", "poisoned", "all_empty", "many_groups",
                                             "grad", "out_dtype")] + [("k", None, "goldens")]
    for n in (2, 3):
        parts = shards.assign(cells, n, unit=_shape_unit)
        assert sorted((c for p in parts for c in p), key=str) == sorted(cells, key=str)
        together = next(p for p in parts if ("k", "ragged_m", "exact") in p)
        assert {c[2] for c in cells[:5]} <= {c[2] for c in together}  # the modes drawing the exact mode's shapes
    assert _shape_unit(("k", "ragged_m", "many_groups")) != _shape_unit(("k", "ragged_m", "exact"))
    assert _shape_unit(("k", "ragged_m", "exact")) != _shape_unit(("k", "ragged_k", "exact"))


def test_a_database_lost_mid_run_is_reported_once_and_never_a_kernels_failure(redis_server, capsys):
    from property_tests.checks import example_db

    url, server = redis_server
    db = example_db.open_database(url)
    server.terminate()
    server.wait(timeout=30)
    good = resolve_kernel(broken_kernels.ragged_dot_correct, convention="ragged_dot", name="good", option="kernel")
    assert check_mode(good, "exact", profile="gmm-ci", example_db=db).status is Status.PASSED
    bad, _ = _recording_run(db)
    assert bad.status is Status.FAILED and "group" in bad.detail and "Connection" not in bad.detail
    err = capsys.readouterr().err
    assert err.count(f"the example database {url} failed") == 1 and "the checks go on without it" in err
