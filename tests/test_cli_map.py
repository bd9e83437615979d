"""``daskqueue map`` run as a user would: a real process, a real LocalCluster; killed with
SIGKILL halfway (the whole process group, as a walltime kill does) and run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

JOB = '''
import os, time
def work(x):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(x + "\\n")
    if x.startswith("bad"):
        raise ValueError("bad item " + x)
    time.sleep(float(os.environ.get("ITEM_S", "0")))
    return {"upper": x.upper()}
'''


def write_job(tmp_path, n, bad=()):
    (tmp_path / "jobmod.py").write_text(JOB)
    items = [f"bad{i}" if i in bad else f"item{i}" for i in range(n)]
    (tmp_path / "in.txt").write_text("".join(x + "\n" for x in items))
    return items


#: The CLI's LocalCluster starts its worker processes from a forkserver (distributed loaded
#: once) instead of each spawning a new interpreter that imports Dask: about 1 s of CPU less
#: per worker, on a 2-core machine running the suite. What these tests check (the job's
#: files, output and exit codes) does not depend on how worker processes start.
CLI_ENV = {"DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "forkserver"}


def run(tmp_path, *args, env=None, **kwargs):
    env = dict(os.environ, RUNS_LOG=str(tmp_path / "runs.log"), **CLI_ENV, **(env or {}))
    return subprocess.run([sys.executable, "-m", "daskqueue.cli", "map", "jobmod:work", "in.txt", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, **kwargs)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(180)
def test_map_writes_results_in_input_order_and_fails_with_the_failed_items(tmp_path):
    items = write_job(tmp_path, 300, bad={7})
    done = run(tmp_path, "--out", "out.jsonl", "--max-retries", "1", "--no-progress", timeout=150)
    assert done.returncode == 1, done.stderr
    assert "300 items: 0 done before this run, 300 put in this run, 1 failed" in done.stderr
    out = lines(tmp_path / "out.jsonl")
    assert [r["index"] for r in out] == list(range(300))
    assert [r["input"] for r in out] == items
    assert out[0]["result"] == {"upper": "ITEM0"}
    assert out[7]["error"] == "ValueError: bad item bad7" and "Traceback" in out[7]["traceback"]


@pytest.mark.slow  # two CLI runs, 14 s; the fast test is test_mapinput's Output written afresh
@pytest.mark.timeout(180)
def test_a_map_run_again_without_durable_writes_its_output_afresh(tmp_path):
    # Without --durable nothing is resumed: a second run on the same --out file (a user
    # running the command again) used to crash with KeyError, its items counted as written.
    write_job(tmp_path, 3)
    first = run(tmp_path, "--out", "out.jsonl", "--no-progress", timeout=150)
    assert first.returncode == 0, first.stderr
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    again = run(tmp_path, "--out", "out.jsonl", "--no-progress", timeout=150)
    assert again.returncode == 0, again.stderr
    assert "2 items: 0 done before this run, 2 put in this run, 0 failed" in again.stderr
    assert [(r["index"], r["result"]) for r in lines(tmp_path / "out.jsonl")] == [
        (0, {"upper": "ONE"}), (1, {"upper": "TWO"})]


@pytest.mark.timeout(180)
def test_map_reads_json_from_stdin_and_writes_unordered_to_stdout(tmp_path):
    (tmp_path / "jobmod.py").write_text("def work(x):\n    return x['a'] * 2\n")
    stdin = "".join(json.dumps({"a": i}) + "\n" for i in range(50))
    done = subprocess.run([sys.executable, "-m", "daskqueue.cli", "map", "jobmod:work", "-", "--json",
                           "--unordered", "--no-progress"], cwd=tmp_path, input=stdin, capture_output=True,
                          text=True, timeout=150, env=dict(os.environ, **CLI_ENV))
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted((r["index"], r["result"]) for r in out) == [(i, 2 * i) for i in range(50)]


@pytest.mark.timeout(300)
def test_a_durable_map_killed_halfway_resumes_without_redoing_done_items(tmp_path):
    n = 200  # a third done before the kill: two consumers' few items in flight are far fewer
    write_job(tmp_path, n)
    env = dict(os.environ, RUNS_LOG=str(tmp_path / "runs.log"), ITEM_S="0.02", **CLI_ENV)
    cmd = [sys.executable, "-m", "daskqueue.cli", "map", "jobmod:work", "in.txt", "--out", "out.jsonl",
           "--durable", "job", "--no-progress", "--workers", "2"]
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    journal = tmp_path / "job" / "done.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if journal.exists() and len(journal.read_text().splitlines()) >= n // 3:
            break
        assert first.poll() is None, first.stderr.read().decode()
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the job's every process, as a walltime kill
    first.wait()
    done_before = {json.loads(line)["index"] for line in journal.read_text().splitlines() if line.endswith("}")}
    assert n // 3 <= len(done_before) < n
    # No wait for the killed workers to go: their locks go with them, and a queue opening on a
    # worker waits for its directory's lock (defaults.LOCK_WAIT_S).
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr
    assert f"{len(done_before):,} done before this run, 0 put in this run" in second.stderr  # all put before
    out = lines(tmp_path / "out.jsonl")
    assert [r["index"] for r in out] == list(range(n))  # complete, in order, nothing twice
    assert all(r["result"] == {"upper": f"ITEM{r['index']}"} for r in out)
    runs = (tmp_path / "runs.log").read_text().split()
    twice = {x for x in runs if runs.count(x) > 1}
    assert not twice & {f"item{i}" for i in done_before}, "an item done before the kill ran again"
    assert len(twice) < n // 4  # only those in flight at the kill ran twice


@pytest.mark.timeout(120)
def test_a_bad_function_or_input_is_a_usage_error(tmp_path):
    write_job(tmp_path, 3)
    done = subprocess.run([sys.executable, "-m", "daskqueue.cli", "map", "jobmod:nope", "in.txt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "has no 'nope'" in done.stderr
    done = subprocess.run([sys.executable, "-m", "daskqueue.cli", "map", "jobmod:work", "missing.txt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot read missing.txt" in done.stderr


def cli(*args, timeout=90):
    return subprocess.run([sys.executable, "-m", "daskqueue.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(180)
def test_stats_and_dead_letters_find_the_pools_of_a_cluster(client, pools):
    from tests import tasks

    address = client.scheduler.address
    qp = pools.queue(2, name="cli-pool", max_retries=0)
    cp = pools.consumer(qp, n_consumers=2)
    cp.start()
    bad = qp.batch_submit([(tasks.boom, i) for i in range(3)])
    cp.join(timeout=60)
    cp.cancel()
    qp.batch_submit([(tasks.double, i) for i in range(40)])
    done = cli("stats", "--scheduler", address)
    assert done.returncode == 0, done.stderr
    assert "pool cli-pool (transient): 2 queues, 2 consumers" in done.stdout
    table = [line.split() for line in done.stdout.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert sum(int(row[2].replace(",", "")) for row in table) == 40  # ready, over both queues
    assert sum(int(row[5].replace(",", "")) for row in table) == 3  # dead
    listed = cli("dead-letters", "list", "--scheduler", address, "--pool", "cli-pool")
    assert listed.returncode == 0, listed.stderr
    assert sorted(int(line.split("\t")[0]) for line in listed.stdout.splitlines()) == sorted(bad)
    assert "boom" in listed.stdout and "3 dead letters listed" in listed.stderr
    replayed = cli("dead-letters", "replay", "--scheduler", address, "--pool", "cli-pool", "--ids", str(bad[0]))
    assert replayed.returncode == 0 and "1 dead letters replayed" in replayed.stderr, replayed.stderr
    purged = cli("dead-letters", "purge", "--scheduler", address, "--pool", "cli-pool")
    assert purged.returncode == 0 and "2 dead letters purged" in purged.stderr, purged.stderr
    assert qp.dead_letters() == []
    missing = cli("dead-letters", "list", "--scheduler", address, "--pool", "nope")
    assert missing.returncode == 2 and "no pool 'nope'" in missing.stderr


@pytest.mark.timeout(180)
def test_map_gives_the_pool_the_default_number_of_queues_of_the_scale_model(tmp_path):
    from daskqueue.queue.config import default_n_queues

    (tmp_path / "jobmod.py").write_text("import daskqueue\ndef work(x):\n    return daskqueue.get_pool().n_queues\n")
    (tmp_path / "in.txt").write_text("a\nb\n")
    done = run(tmp_path, "--workers", "3", "--out", "out.jsonl", "--no-progress", timeout=150)
    assert done.returncode == 0, done.stderr
    assert {r["result"] for r in lines(tmp_path / "out.jsonl")} == {default_n_queues(3)}  # not one per worker
