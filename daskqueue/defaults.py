"""Default values of every tunable, in one place. Constructors document and validate them."""

from __future__ import annotations

#: How long a delivered message stays leased before it is redelivered (consumers extend
#: the lease of work they are still running every ``lease_timeout_s / 3``).
LEASE_TIMEOUT_S: float = 30.0

#: How many times a failed (or lease-expired) message is retried before it is dead-lettered.
MAX_RETRIES: int = 3

#: Backoff before a retry: ``min(max, base * 2**(attempt-1))``, times a random factor in
#: ``[1 - jitter, 1]``.
RETRY_BACKOFF_BASE_S: float = 0.05
RETRY_BACKOFF_MAX_S: float = 30.0
RETRY_BACKOFF_JITTER: float = 0.5

#: Largest single message payload a queue accepts.
MAX_MESSAGE_BYTES: int = 64 * 2**20

#: How many messages go in one ``put_batch`` call from the client.
PUT_BATCH_MESSAGES: int = 20_000

#: Largest batch a consumer fetches, and the adaptive target of work per fetched batch.
#: The adaptive size starts at one message (a consumer knows nothing of the tasks' duration
#: yet, and must not hoard long ones) and grows at most 4x per batch.
MAX_BATCH_SIZE: int = 20_000
INITIAL_BATCH_SIZE: int = 1
TARGET_BATCH_S: float = 0.05

#: How long an idle consumer's ``get_batch`` waits on its home queue before looking elsewhere.
IDLE_POLL_S: float = 1.0

#: How many fetched batches a consumer may hold beyond those running (prefetch depth).
PREFETCH_BATCHES: int = 1

#: Threads per consumer that run user code.
MAX_CONCURRENCY: int = 1

#: The default number of queues of a transient ``QueuePool`` (``n_queues=None``) follows the
#: scale model in benchmarks/README.md ("Issue 24: peers"): every busy run slot of a consumer
#: makes about two calls (``get_batch`` + ``settle``) per ``TARGET_BATCH_S`` of work, one
#: queue should serve at most ``QUEUE_CALLS_PER_S`` of them (about half of what one queue
#: actor's process served remote consumers on the 2-core benchmark machine), and the client
#: polls every queue for outcomes each round, so the default stops at ``MAX_DEFAULT_QUEUES``
#: (more is for ``n_queues=`` or ``add_queues``). 2 workers x 1 thread: 1 queue; 32 x 1: 2;
#: 100 x 32: 32.
QUEUE_CALLS_PER_S: float = 1000.0
MAX_DEFAULT_QUEUES: int = 32

#: How often ``join`` and ``map`` poll the queues for progress and results.
POLL_INTERVAL_S: float = 0.05

#: Durable queues: how often an ``fsync="interval"`` store syncs, how big a log segment is,
#: and how big the index may grow before it is compacted.
FSYNC_INTERVAL_S: float = 0.1
MAX_SEGMENT_BYTES: int = 64 * 2**20
COMPACT_INDEX_BYTES: int = 16 * 2**20

#: The smallest log segment a durable queue accepts: one page holds the file header and
#: records of a useful size (``segment/store.py``; FORMAT.md "Log segment").
MIN_SEGMENT_BYTES: int = 4096

#: The longest single long-poll of ``result(task_id)``: a longer wait is made of such slices,
#: so that its deadline is kept and a lost queue is noticed.
RESULT_POLL_SLICE_S: float = 1.0

#: How long a consumer's fetch loop waits after fetching failed, before it tries again.
FETCH_RETRY_S: float = 1.0

#: Added to a queue sweeper's sleep until the next due time (lease deadline or delayed
#: message), so that it wakes just after the time, when the message is due, not just before.
DUE_WAKEUP_MARGIN_S: float = 0.001

#: Elastic pools. How long the client waits for a consumer actor to start on a worker,
#: for a call to a queue or consumer made while following the cluster, and for every
#: consumer's ``stop``/``close`` together: all below the 30 s any public call may take
#: after a worker dies.
ACTOR_START_TIMEOUT_S: float = 20.0
#: Queue actors may take longer to start: a durable one recovers its directory first.
QUEUE_START_TIMEOUT_S: float = 600.0
#: How long a call to a durable queue that is being reopened elsewhere waits for the move
#: before it raises ``QueueMovedError`` (the reopen goes on; a later call finds the queue).
MOVE_WAIT_S: float = 25.0
CONTROL_CALL_TIMEOUT_S: float = 10.0
#: How long a call to a queue of a pool at rest (no worker yet, or adapt let the last one go)
#: waits for a worker to join, having asked ``adapt`` for one, before it raises
#: ``NoWorkerError`` (a batch system may take minutes to start a job).
WORKER_WAIT_S: float = 120.0
#: How long a queue that handed its state over (``hand_off``) waits for the client to confirm
#: (``handoff_done``) or call it off (``handoff_abort``) before it serves again on its own:
#: a client that gave up on a slow hand-off must not leave a queue that refuses every call.
HANDOFF_CONFIRM_S: float = 30.0
#: The longest a client call to a queue may wait for its answer when the caller gave no
#: timeout (a long poll waits its own time more): past it, ``QueueCallTimeoutError``, even
#: while the queue's worker counts as alive (its event loop blocked).
CALL_TIMEOUT_S: float = 60.0
#: How long past the caller's own deadline a call made within a wait (``join``, ``map``,
#: ``result``) may still be answered: a queue that answers gives the wait its counts to
#: report; one that does not costs the caller at most this more.
CALL_GRACE_S: float = 1.0
#: How long the membership thread waits for a successor queue actor to start (and for its
#: hand-off state to reach the worker): a slower start is finished on a later membership
#: event or call, so no other reaction waits behind it.
SUCCESSOR_WAIT_S: float = 20.0
#: How many times a put is sent in all when its queue moves while it is in flight (each
#: retry waits for the move; the put's token keeps it from being stored twice).
PUT_ATTEMPTS: int = 3
#: How long a consumer on a retiring worker may take to finish its running items and
#: settle, before it is let go (its unsettled leases are taken back when the worker leaves).
RETIRE_STOP_TIMEOUT_S: float = 12.0
STOP_TIMEOUT_S: float = 25.0

#: Consumers: where user code runs. ``"auto"`` runs a consumer's batches in a child process
#: when its worker also holds a queue, ``"process"`` always, ``"thread"`` never.
ISOLATION: str = "auto"

#: How long a durable queue opening its directory waits for another actor's lock on it to
#: go: an actor whose client died (a restarted notebook kernel) closes within seconds.
LOCK_WAIT_S: float = 8.0

#: Type scheduling (``QueuePool(scheduler="fair" | "capped")``): the largest share of the
#: pool's running slots one type may hold while another type waits, and how many runs of
#: ready messages a queue looks past for a type under its limit.
MAX_TYPE_SHARE: float = 0.8
MAX_SCAN: int = 1000
#: How often a queue of a typed pool tells its peers its ready and running counts per type
#: (when they changed; every second regardless), and how old a peer's report may be before
#: it is no longer counted (its queue stopped reporting: moved, lost, closed).
TYPE_GOSSIP_S: float = 0.05
TYPE_GOSSIP_STALE_S: float = 3.0
MOVE_POLL_S: float = 0.1  # how often remove_queue looks whether its queue is drained
DIR_MODE: int = 0o700  # a new durable directory's mode: the owner only (files: 0o600)
TIME_LIMIT_GRACE_S: float = 5.0  # how long a task past its time limit may ignore the interruption

#: Upper bounds (seconds) of a consumer's task-duration histogram (``ConsumerStats``,
#: ``daskqueue_consumer_task_duration_seconds``).
DURATION_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)

# -- bounded function tables and membership waits ------------------------------------------------

#: The client's cache of functions pickled by reference (by function object): the newest this
#: many are kept; an older one is pickled again when used again.
FUNCTION_CACHE_ENTRIES: int = 1024
#: Per queue, how many function digests the client remembers having sent it (an older one is
#: sent again with the next put that uses it; the queue ignores a function it holds).
SENT_FUNCTIONS_PER_QUEUE: int = 4096
#: The membership thread (``daskqueue/membership.py``) never waits without bound: a call to
#: the scheduler (its worker list) gives up after ``MEMBERSHIP_CALL_TIMEOUT_S`` (retried);
#: with no event it wakes every ``MEMBERSHIP_IDLE_S`` to see whether its client closed; it
#: waits for each pool's reaction to a change at most ``REACTION_WAIT_S`` (in the pools'
#: order, so a queue pool's reaction normally ends before its consumer pool's starts), then
#: goes on while that reaction runs on (``daskqueue/reactions.py``); ``forget`` waits at most
#: ``MEMBERSHIP_CLOSE_WAIT_S`` for the thread to end.
MEMBERSHIP_CALL_TIMEOUT_S: float = 10.0
MEMBERSHIP_IDLE_S: float = 1.0
REACTION_WAIT_S: float = 10.0
MEMBERSHIP_CLOSE_WAIT_S: float = 12.0

# -- evicting task functions (queues and consumers) -----------------------------------------------

#: A queue sweeps its function table (keeping the functions its messages and dead letters
#: use) at a put once the table has doubled since its last sweep and holds more than this
#: many, and from its sweeper.
QUEUE_FUNCTION_SWEEP_MIN: int = 1024
#: How many functions no message uses a queue keeps anyway (the newest swept), so that a
#: function used again soon need not be sent again.
QUEUE_IDLE_FUNCTIONS: int = 256
#: How many functions a consumer keeps (pickled and unpickled, each), and its child process
#: too: the newest used.
CONSUMER_FUNCTION_CACHE_ENTRIES: int = 512

#: Walltime-aware consumers (``daskqueue/consumer/walltime.py``): a consumer on a worker that
#: will leave (``--lifetime``, a SLURM job's end) takes only work whose estimate ends
#: ``WALLTIME_MARGIN_S`` before then. An item's estimate: the ``WALLTIME_QUANTILE`` of the
#: last ``WALLTIME_DURATION_WINDOW`` per-item times of its type, times ``WALLTIME_SAFETY``.
WALLTIME_MARGIN_S: float = 2.0
WALLTIME_QUANTILE: float = 0.95
WALLTIME_DURATION_WINDOW: int = 50
WALLTIME_SAFETY: float = 1.5
#: Under SLURM, a worker whose job ends before its ``--lifetime`` (or that has none) retires
#: itself this long before the job's end, so that its queues are handed off before the kill.
SLURM_RETIRE_BEFORE_S: float = 60.0
