"""durable: the durable queue's disk path, beside the raw speed of the same disk.

Four measurements, all in one run and all in ``--dir`` (default: a fresh temporary directory
under ``$TMPDIR``), so the durable figures and their baselines hit the same filesystem:

1. **put throughput** of a ``DurableQueue`` driven in-process (no Dask: this isolates the
   store), for 100 B and 10 KiB payloads, under ``fsync`` ``always`` / ``interval`` /
   ``never``. Each ``put_batch`` carries ``--batch`` messages (one log append, one index
   append, at most one fsync). Baselines: a Python loop writing the same bytes in blocks of one
   put's size (``os.write``; with ``os.fsync`` after every block for ``always``), ``dd``
   (``conv=fdatasync``) and a ``TransientQueue`` fed the same blobs.
2. **end to end**: ``qp.map`` of N no-op tasks on a ``LocalCluster`` through a durable pool
   (default ``fsync="interval"``) and a transient pool, alternated, best of ``--repeat``
   (goal: durable at least 0.5x transient).
3. **reopen**: a queue holding ``--reopen-messages`` (default 1,000,000) ready 100 B
   messages, put 20,000 per call (what ``QueuePool`` sends) and 100 per call, and
   ``--reopen-single`` messages put one per call (recovery costs per put call, not per
   message); left as a killed process leaves it, then closed cleanly; the time to open it
   again (goal: under 3 s). Baseline: reading every file of the directory once.
4. **disk bytes per message** while messages wait, and the disk left once all are acked.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common, tasks
from benchmarks.common import daskqueue_pools, local_cluster, log, positive, row

SIZES = {"100 B": 100, "10 KiB": 10 * 1024}
POLICIES = ("always", "interval", "never")


# -- raw disk --------------------------------------------------------------------------------


def raw_write(path: Path, block: bytes, blocks: int, *, fsync_each: bool) -> float:
    """Seconds to write ``blocks`` x ``block`` sequentially to a new file with ``os.write``
    (and ``os.fsync`` after each block if ``fsync_each``). The file is removed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(blocks):
            os.write(fd, block)
            if fsync_each:
                os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return seconds


def dd_write(path: Path, mib: int) -> dict[str, Any] | None:
    """``dd bs=1M count=mib conv=fdatasync`` of random-ish data: MB/s, or None without dd."""
    if shutil.which("dd") is None:
        return None
    src = path.with_suffix(".src")
    src.write_bytes(os.urandom(2**20) * mib)  # not zeros: no filesystem shortcut
    try:
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={src}", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                       check=True, capture_output=True)
        seconds = time.perf_counter() - t0
    finally:
        src.unlink()
        path.unlink(missing_ok=True)
    return {"mib": mib, "seconds": seconds, "mb_per_s": mib * 2**20 / seconds / 1e6}


def read_all(dirpath: Path) -> float:
    """Seconds to read every file in ``dirpath`` once (the page cache is warm, as on reopen)."""
    t0 = time.perf_counter()
    for p in sorted(dirpath.iterdir()):
        with open(p, "rb", buffering=0) as f:
            while f.read(8 * 2**20):
                pass
    return time.perf_counter() - t0


# -- the queue, in-process -------------------------------------------------------------------


def put_blob(payload: bytes, n: int) -> bytes:
    """One ``put_batch`` blob of ``n`` raw messages, each ``payload`` (pickled bytes)."""
    from daskqueue.messages import Kind
    from daskqueue.serialize import Group, encode_put, pack_payloads

    offsets, data = pack_payloads([payload] * n, max_message_bytes=2**30)
    return encode_put([Group(Kind.RAW, None, None, 0, None, 0.0, n, offsets, data)], {})


async def timed_puts(q: Any, blob: bytes, puts: int) -> float:
    t0 = time.perf_counter()
    for _ in range(puts):
        await q.put_batch(blob)
    return time.perf_counter() - t0


async def drain_all(q: Any, batch: int = 20_000) -> int:
    """Lease and ack everything ready; the number of messages."""
    from daskqueue.serialize import decode_delivery, encode_settle

    n = 0
    while True:
        blob = await q.get_batch(batch, 0.0)
        if blob is None:
            return n
        lease_id, _, segments = decode_delivery(blob)
        k = sum(s.count for s in segments)
        await q.settle(lease_id, encode_settle(k, {}, set(), None))
        n += k


async def put_case(workdir: Path, size: int, policy: str, total_bytes: int, batch: int) -> dict[str, Any]:
    """Put ``total_bytes`` of ``size``-byte messages under ``policy``; then drain and compact."""
    from daskqueue.queue.durable import DurableQueue

    d = workdir / f"put-{size}-{policy}"
    q = DurableQueue(0, str(d), fsync=policy)
    blob = put_blob(os.urandom(size), batch)
    puts = max(1, total_bytes // (size * batch))
    await q.put_batch(put_blob(b"warm", 1))
    seconds = await timed_puts(q, blob, puts)
    t0 = time.perf_counter()
    q._store.sync()  # what interval/never still owe the disk
    final_sync = time.perf_counter() - t0
    usage = await q.disk_usage()
    n = puts * batch
    drained = await drain_all(q)
    assert drained == n + 1, (drained, n)
    await q.compact()
    after = await q.disk_usage()
    await q.close()
    shutil.rmtree(d)
    return {
        "payload_bytes": size, "policy": policy, "batch": batch, "puts": puts, "messages": n,
        "seconds": seconds, "final_sync_s": final_sync, "msgs_per_s": n / seconds,
        "mb_per_s": n * size / seconds / 1e6, "blob_bytes": len(blob),
        "disk_bytes_waiting": usage["disk_bytes"], "disk_bytes_per_message": usage["disk_bytes"] / n,
        "disk_bytes_after_ack_and_compact": after["disk_bytes"], "segments_after": after["segments"],
    }


async def transient_put_case(size: int, total_bytes: int, batch: int) -> dict[str, Any]:
    from daskqueue.queue.transient import TransientQueue

    q = TransientQueue(0)
    blob = put_blob(os.urandom(size), batch)
    puts = max(1, total_bytes // (size * batch))
    await q.put_batch(put_blob(b"warm", 1))
    seconds = await timed_puts(q, blob, puts)
    await q.close()
    n = puts * batch
    return {"payload_bytes": size, "messages": n, "seconds": seconds, "msgs_per_s": n / seconds,
            "mb_per_s": n * size / seconds / 1e6}


async def reopen_case(workdir: Path, messages: int, batch: int) -> dict[str, Any]:
    """Fill a queue with ``messages`` ready 100 B messages, ``batch`` per put; drop it as a
    killed process would (descriptors closed, nothing synced or written) and time the reopen;
    then close it cleanly and time the reopen again."""
    from daskqueue.queue.durable import DurableQueue

    d = workdir / f"reopen-{batch}"
    q = DurableQueue(0, str(d), fsync="never")
    blob = put_blob(os.urandom(100), batch)
    t0 = time.perf_counter()
    for _ in range(messages // batch):
        await q.put_batch(blob)
    fill_s = time.perf_counter() - t0
    usage = await q.disk_usage()
    _drop_like_a_killed_process(q)
    del q
    gc.collect()
    out: dict[str, Any] = {"messages": messages, "batch": batch, "puts": messages // batch,
                           "fill_s": fill_s, **usage}
    for how in ("killed", "clean"):
        t0 = time.perf_counter()
        q = DurableQueue(0, str(d), fsync="never")
        seconds = time.perf_counter() - t0
        report = await q.recovery_report()
        assert report["messages"] == messages and report["lost_messages"] == 0, report
        out[f"reopen_{how}_s"] = seconds
        out[f"recovery_{how}"] = report
        await q.close()
        del q
        gc.collect()
    out["read_all_files_s"] = read_all(d)
    shutil.rmtree(d)
    return out


def _drop_like_a_killed_process(q: Any) -> None:
    """Close every descriptor of ``q``'s store without writing or syncing anything."""
    store = q._store
    if q._sweeper is not None:
        q._sweeper.cancel()
    for segment in store._segments.values():
        segment._map.close()
        os.close(segment._fd)
    store._segments.clear()
    os.close(store._index._fd)
    store._index._fd = -1
    if hasattr(store, "_lock_fd"):  # 5cff51c's store (run_all --daskqueue /work/wt/old)
        os.close(store._lock_fd)
        store._lock_fd = -1
    else:
        store._lock.drop()  # closed, not unlocked: the kernel drops the flock, as at a kill


# -- end to end on a cluster -----------------------------------------------------------------


def end_to_end(args: Any, workdir: Path) -> dict[str, Any]:
    n = args.e2e_tasks
    out: dict[str, list[float]] = {"transient": [], "durable": []}
    with local_cluster(args.workers, args.threads) as client:
        for rep in range(args.repeat):
            for kind in ("transient", "durable"):
                opts: dict[str, Any] = {}
                if kind == "durable":
                    opts = {"durability": "durable", "dirpath": str(workdir / f"e2e-{rep}"),
                            "fsync": args.e2e_fsync}
                with daskqueue_pools(client, queue_options=opts) as (qp, _):
                    qp.map(tasks.noop, range(1000))
                    t0 = time.perf_counter()
                    res = qp.map(tasks.noop, range(n))
                    seconds = time.perf_counter() - t0
                    ok = res == list(range(n))
                    del res
                    assert ok, f"{kind}: wrong results"
                out[kind].append(seconds)
                log(f"  {kind:9s} {n / seconds:,.0f} tasks/s")
                if kind == "durable":
                    shutil.rmtree(workdir / f"e2e-{rep}")
    return {"tasks": n, "fsync": args.e2e_fsync, "seconds": out,
            "best_tasks_per_s": {k: n / min(v) for k, v in out.items()}}


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    p = common.parser("durable", __doc__)
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    p.add_argument("--put-mib", type=positive, default=128, help="MiB put per (payload, policy) case")
    p.add_argument("--batch", type=positive, default=1000, help="messages per put_batch")
    p.add_argument("--put-repeat", type=positive, default=5,
                   help="transient-queue put runs per payload size (the row: the median run)")
    p.add_argument("--e2e-tasks", type=positive, default=1_000_000, help="tasks per end-to-end run")
    p.add_argument("--e2e-fsync", choices=POLICIES, default="interval", help="fsync of the durable pool")
    p.add_argument("--repeat", type=positive, default=2, help="end-to-end runs of each kind (best kept)")
    p.add_argument("--reopen-messages", type=positive, default=1_000_000, help="ready messages reopened")
    p.add_argument("--reopen-batch", type=positive, default=20_000,
                   help="messages per put when filling (20,000: what QueuePool sends per call)")
    p.add_argument("--reopen-single", type=positive, default=100_000,
                   help="ready messages reopened when each was its own put (qp.submit one by one)")
    args = p.parse_args()
    env = common.environment("durable")
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="daskqueue-bench-", dir=base))
    total = args.put_mib * 2**20
    details: dict[str, Any] = {"dir": str(workdir), "filesystem": _filesystem(workdir)}
    rows = []
    try:
        log(f"raw disk in {workdir} ({details['filesystem']})")
        dds = [dd_write(workdir / "dd.bin", min(args.put_mib, 256)) for _ in range(3)]
        details["dd"] = None if dds[0] is None else max(dds, key=lambda d: d["mb_per_s"])
        details["put"], details["raw"], details["transient_put"] = [], {}, {}
        for label, size in SIZES.items():
            block = os.urandom(size * args.batch)
            blocks = max(1, total // len(block))
            raw = {  # best of 3: the baseline is the disk at its best, not at its noisiest
                "block_bytes": len(block), "blocks": blocks,
                "write_s": min(raw_write(workdir / "raw.bin", block, blocks, fsync_each=False) for _ in range(3)),
                "write_fsync_each_s": min(raw_write(workdir / "raw.bin", block, max(1, blocks // 4), fsync_each=True)
                                          for _ in range(3)),
            }
            raw["write_mb_per_s"] = blocks * len(block) / raw["write_s"] / 1e6
            raw["write_fsync_each_mb_per_s"] = max(1, blocks // 4) * len(block) / raw["write_fsync_each_s"] / 1e6
            details["raw"][label] = raw
            # One transient put run lasts 10-50 ms at the quick size and is mostly copying the
            # blobs into fresh memory (page faults): it swings 1.4-2x between runs of the same
            # code, so the row is the median of several.
            trs = [asyncio.run(transient_put_case(size, total, args.batch)) for _ in range(args.put_repeat)]
            tr = {**sorted(trs, key=lambda t: t["mb_per_s"])[len(trs) // 2],
                  "mb_per_s_samples": [t["mb_per_s"] for t in trs]}  # in run order
            details["transient_put"][label] = tr
            for policy in POLICIES:
                case = asyncio.run(put_case(workdir, size, policy, total, args.batch))
                details["put"].append(case)
                baseline = raw["write_fsync_each_mb_per_s"] if policy == "always" else raw["write_mb_per_s"]
                bname = ("os.write+fsync per block" if policy == "always" else "os.write loop") + \
                    f", {len(block) // 1024} KiB blocks"
                log(f"  {label:6s} fsync={policy:8s} {case['msgs_per_s']:>12,.0f} msgs/s "
                    f"{case['mb_per_s']:8,.1f} MB/s  (raw {baseline:,.1f} MB/s)")
                rows.append(row(f"put {label} msgs, fsync={policy}: MB/s ({case['msgs_per_s']:,.0f} msgs/s)",
                                case["mb_per_s"], "MB/s", bname, baseline))
            rows.append(row(f"put {label} msgs, transient queue (same blobs): MB/s",
                            tr["mb_per_s"], "MB/s", "os.write loop", raw["write_mb_per_s"],
                            note=f"reference: the in-memory queue; median of {args.put_repeat}"))
        if details["dd"]:
            rows.append(row("dd conv=fdatasync, 1 MiB blocks", details["dd"]["mb_per_s"], "MB/s",
                            "os.write loop, 10,000 KiB blocks", details["raw"]["10 KiB"]["write_mb_per_s"]))
        for case in details["put"]:
            if case["policy"] == "interval":
                label = f"{case['payload_bytes']} B" if case["payload_bytes"] < 1024 else "10 KiB"
                rows.append(row(f"disk bytes per waiting {label} message", case["disk_bytes_per_message"],
                                "B", "payload bytes", case["payload_bytes"], better="lower"))
                rows.append(row(f"disk bytes after all {label} msgs acked + compacted",
                                case["disk_bytes_after_ack_and_compact"], "B",
                                "bytes while waiting", case["disk_bytes_waiting"], better="lower"))

        details["reopen"] = []
        for messages, batch in [(args.reopen_messages, args.reopen_batch), (args.reopen_messages, 100),
                                (args.reopen_single, 1)]:
            log(f"reopen: {messages:,} ready 100 B messages put {batch:,} per put_batch")
            ro = asyncio.run(reopen_case(workdir, messages, batch))
            details["reopen"].append(ro)
            log(f"  after kill {ro['reopen_killed_s']:.2f} s, after clean close {ro['reopen_clean_s']:.2f} s, "
                f"read all files {ro['read_all_files_s']:.2f} s")
            for how in ("killed", "clean"):
                rows.append(row(f"reopen {messages:,} ready msgs, {batch:,}/put ({how})", ro[f"reopen_{how}_s"],
                                "s", "read every file once", ro["read_all_files_s"], better="lower",
                                note="goal < 3 s for 1,000,000"))

        log(f"end to end: qp.map of {args.e2e_tasks:,} no-ops, transient vs durable (fsync={args.e2e_fsync})")
        details["e2e"] = e2e = end_to_end(args, workdir)
        rate = e2e["best_tasks_per_s"]
        rows.append(row(f"qp.map {args.e2e_tasks:,} no-ops, durable fsync={args.e2e_fsync}", rate["durable"],
                        "tasks/s", "same, transient", rate["transient"], note="goal >= 0.5x"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    common.report("durable", args, rows, details, env=env)


def _filesystem(path: Path) -> str:
    """``device on mountpoint type fstype`` of the filesystem holding ``path``."""
    try:
        out = subprocess.run(["df", "--output=source,target,fstype", str(path)], capture_output=True,
                             text=True, check=True).stdout.splitlines()[-1].split()
        return f"{out[0]} on {out[1]} ({out[2]})"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


if __name__ == "__main__":
    main()
