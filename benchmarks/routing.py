"""routing: how many keys change queue when a queue is added, consistent-hash ring vs modulo.

For n = 2..16 queues, ``--keys`` keys (``"key-<i>"``) are routed with daskqueue's ring
(``daskqueue.queue.ring.HashRing``, 128 points per queue) and with ``stable_hash(key) % n``;
then a queue is added (n + 1) and the fraction of keys whose queue changed is counted. The
ideal for adding one queue is 1/(n+1); modulo moves about n/(n+1). Also reported: how evenly
the ring spreads the keys (largest queue's share over the mean). Pure computation: no cluster.
"""

from __future__ import annotations

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


def main() -> None:
    p = common.parser("routing", __doc__)
    p.add_argument("--keys", type=positive, default=100_000, help="keys routed")
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
    common.report("routing", args, rows, details, env=env)


if __name__ == "__main__":
    main()
