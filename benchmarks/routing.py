"""routing: how many keys change queue when a queue is added, consistent-hash ring vs modulo.

For n = 2..16 queues, ``--keys`` keys (``"key-<i>"``) are routed with daskqueue's ring
(``daskqueue.queue.ring.HashRing``, 128 points per queue) and with ``stable_hash(key) % n``;
then a queue is added (n + 1) and the fraction of keys whose queue changed is counted. The
ideal for adding one queue is 1/(n+1); modulo moves about n/(n+1). Also reported: how evenly
the ring spreads the keys (largest queue's share over the mean).

Then the same on a real cluster (``--cluster-keys`` keys, one waiting message each, on a
transient pool of n = 2, 4 and 8 queues with no consumers): ``QueuePool.add_queues(1)``
moves the waiting messages of the keys the new queue takes over; the fraction of messages
that moved (what the new queue holds) is reported beside what ``hash % n`` would move, and the
time the call took beside the time the same messages took to put. One call's time swings
+-30% on the same code (the actor start and the moves are a few round trips on a shared
machine), so each n is measured ``--repeat`` times on fresh pools and the row reports the
median, with every sample in the JSON.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import common
from benchmarks.common import log, positive, row
from daskqueue.queue.ring import HashRing, stable_hash


def moved_fraction(n: int, keys: list[str]) -> dict:
    before, after = HashRing(range(n)), HashRing(range(n + 1))
    hashes = [stable_hash(k) for k in keys]
    ring_moved = sum(before.node(k) != after.node(k) for k in keys) / len(keys)
    mod_moved = sum(h % n != h % (n + 1) for h in hashes) / len(keys)
    load = [0] * n
    for k in keys:
        load[before.node(k)] += 1
    return {"n": n, "ring_moved": ring_moved, "modulo_moved": mod_moved, "ideal": 1 / (n + 1),
            "ring_max_over_mean": max(load) / (len(keys) / n)}


def measured_moves(client, n: int, keys: list[str]) -> dict:
    """Put one message per key on a pool of ``n`` queues, add a queue; what moved, how fast."""
    from daskqueue import QueuePool

    qp = QueuePool(client, n)
    try:
        started = time.perf_counter()
        qp.put_many(range(len(keys)), keys=keys)
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        qp.add_queues(1)
        add_s = time.perf_counter() - started
        stats = {s.index: s for s in qp.stats()}
        assert sum(s.ready for s in stats.values()) == len(keys), "a message went missing"
        moved = stats[n].ready / len(keys)
    finally:
        qp.close()
    hashes = [stable_hash(k) for k in keys]
    return {"n": n, "moved": moved, "modulo_moved": sum(h % n != h % (n + 1) for h in hashes) / len(keys),
            "ideal": 1 / (n + 1), "add_s": add_s, "put_s": put_s}


def median_moves(samples: list[dict]) -> dict:
    """One n's samples as one: the medians of the times (the fractions are the same every
    time: the ring is deterministic), every sample kept."""
    out = dict(samples[0])
    for k in ("add_s", "put_s"):
        out[f"{k}_samples"] = [d[k] for d in samples]
        out[k] = statistics.median(out[f"{k}_samples"])
    return out


def main() -> None:
    p = common.parser("routing", __doc__)
    p.add_argument("--keys", type=positive, default=100_000, help="keys routed")
    p.add_argument("--cluster-keys", type=positive, default=50_000, help="keys (one message each) moved on a cluster")
    p.add_argument("--repeat", type=positive, default=3,
                   help="add_queues(1) samples per n, on fresh pools (the row reports the median)")
    args = p.parse_args()
    env = common.environment("routing")
    keys = [f"key-{i}" for i in range(args.keys)]
    details = {"by_n": [moved_fraction(n, keys) for n in range(2, 17)]}
    for d in details["by_n"]:
        log(f"n={d['n']:2d}: ring moves {d['ring_moved']:.3f} (ideal {d['ideal']:.3f}), modulo "
            f"{d['modulo_moved']:.3f}; ring's fullest queue {d['ring_max_over_mean']:.2f}x the mean")
    worst = max(details["by_n"], key=lambda d: d["ring_moved"] * (d["n"] + 1))
    mean_ring = sum(d["ring_moved"] for d in details["by_n"]) / len(details["by_n"])
    mean_mod = sum(d["modulo_moved"] for d in details["by_n"]) / len(details["by_n"])
    rows = [
        row("keys moved adding one queue, mean over n=2..16", mean_ring, "fraction",
            "hash % n", mean_mod, better="lower"),
        row(f"keys moved at n={worst['n']} (the ring's worst vs ideal)", worst["ring_moved"], "fraction",
            "ideal 1/(n+1)", worst["ideal"], better="lower"),
    ]
    cluster_keys = [f"key-{i}" for i in range(args.cluster_keys)]
    with common.local_cluster(2) as client:
        details["cluster"] = [median_moves([measured_moves(client, n, cluster_keys) for _ in range(args.repeat)])
                              for n in (2, 4, 8)]
    for d in details["cluster"]:
        log(f"cluster n={d['n']}: add_queues(1) moved {d['moved']:.3f} of the waiting messages (ideal "
            f"{d['ideal']:.3f}, modulo {d['modulo_moved']:.3f}) in {d['add_s']:.3f} s, median of "
            f"{', '.join(f'{x:.3f}' for x in d['add_s_samples'])} (put: {d['put_s']:.3f} s)")
    for d in details["cluster"]:
        rows.append(row(f"messages moved by add_queues(1), n={d['n']}, {len(cluster_keys):,} keys", d["moved"],
                        "fraction", "hash % n", d["modulo_moved"], better="lower"))
    slowest = max(details["cluster"], key=lambda d: d["add_s"])
    rows.append(row(f"add_queues(1) time, n={slowest['n']} (slowest)", slowest["add_s"], "s",
                    "putting the messages", slowest["put_s"], better="lower", note=f"medians of {args.repeat}"))
    common.report("routing", args, rows, details, env=env)


if __name__ == "__main__":
    main()
