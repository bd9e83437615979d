"""The daskqueue status page beside Dask's dashboard, and HTML tables of pools for notebooks.

:func:`install` adds two routes to the scheduler's HTTP server (the one serving Dask's
dashboard, port 8787 by default): ``/daskqueue``, one table of queues and one of consumers per
registered pool (``daskqueue.registry``), reloading itself every ``REFRESH_S``; and
``/daskqueue/status.json``, the same data. A request asks each worker holding a pool's actors
once, with the ``daskqueue_status`` RPC (:func:`daskqueue.metrics.snapshot`: the numbers
``/metrics`` shows), all workers at once, each within ``TIMEOUT_S``: an actor whose worker
does not answer shows as ``unreachable``; the page never hangs.

:func:`pool_html` and :func:`consumer_pool_html` render a ``QueuePool``'s or
``ConsumerPool``'s live counts from the client, for ``_repr_html_``, within one deadline.
:func:`render_page` and :func:`render_pool` are pure: pool stats dicts in, HTML out.

A pool stats dict: ``{"name", "durability", "queues": [row], "consumers": [row]}``; a row has
``index``, ``worker``, ``state`` (``"ok"``, ``"unreachable"``, ``"gone"`` (its worker no longer
holds it: closed, moved or lost) or ``"error"``), ``error`` (text, when not ok), and the
numbers of :func:`daskqueue.metrics.snapshot` (a queue: ``ready``, ``delayed``, ``leased``,
``dead``, ``bytes``, ``puts``, ``acks``, ``retries``; a consumer: ``busy_slots``, ``slots``,
``done``, ``failed``, ``batches``, ``duration_count``, ``duration_sum_s``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
import logging
import time
import weakref
from typing import Any, Iterable

from distributed.diagnostics.plugin import WorkerPlugin
from tornado.web import RequestHandler

from daskqueue import metrics
from daskqueue.registry import CONSUMERS_KEY, POOLS_KEY

__all__ = ["install", "page_url", "collect_status", "render_page", "render_pool", "pool_html",
           "consumer_pool_html", "PAGE_PATH", "JSON_PATH"]

logger = logging.getLogger("daskqueue")

PAGE_PATH = "/daskqueue"
JSON_PATH = "/daskqueue/status.json"

#: How long a page request waits for the workers, and how often the page reloads itself.
TIMEOUT_S = 2.0
REFRESH_S = 2

#: Longest :func:`install` waits for the scheduler (and, through it, the workers).
INSTALL_TIMEOUT_S = 10.0

#: (field, column heading) of the tables; a column no row has a number for is left out.
QUEUE_COLUMNS = [("ready", "ready"), ("delayed", "delayed"), ("leased", "leased"), ("dead", "dead"),
                 ("bytes", "bytes held"), ("puts", "put"), ("acks", "acked"), ("retries", "retried")]
CONSUMER_COLUMNS = [("busy_slots", "busy slots"), ("slots", "slots"), ("done", "done"),
                    ("failed", "failed"), ("batches", "batches"), ("mean_task_ms", "mean task ms")]

#: What a timed-out wait raises (one class from Python 3.11 on, three before).
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)

_installed: weakref.WeakSet[Any] = weakref.WeakSet()  # schedulers (of this process) with the routes


# -- installing the page -----------------------------------------------------------------------


class StatusWorkerPlugin(WorkerPlugin):
    """Gives every worker, present and future, the ``daskqueue_status`` RPC handler."""

    idempotent = True
    name = "daskqueue-status"

    def setup(self, worker: Any) -> None:
        metrics.install_status_handler(worker)


def install(client: Any, *, timeout_s: float = INSTALL_TIMEOUT_S) -> str:
    """Add the status page to the scheduler's HTTP server of ``client``'s cluster and the
    status handler to its workers (present and future); return the page's URL.

    Idempotent; one round trip to the scheduler, within ``timeout_s``. Never raises: the page
    is for watching pools, not a reason for one to fail; on failure it logs a warning and
    returns ""."""
    try:
        client.run_on_scheduler(_install_on_scheduler, callback_timeout=timeout_s)
        return page_url(client)
    except Exception as e:
        logger.warning("could not install the daskqueue status page: %s: %s", type(e).__name__, e)
        return ""


def page_url(client: Any) -> str:
    """The status page's URL as the client sees the scheduler: ``dashboard_link`` with
    ``/daskqueue`` for ``/status``; "" if the scheduler has no HTTP server."""
    link = client.dashboard_link or ""
    if link.endswith("/status"):
        return link[: -len("/status")] + PAGE_PATH
    info = client.scheduler_info()
    port = info.get("services", {}).get("dashboard")
    host = info["address"].split("://")[-1].rsplit(":", 1)[0]
    return f"http://{host}:{port}{PAGE_PATH}" if port else ""


class StatusPage(RequestHandler):
    """``GET /daskqueue``: the page (see :func:`render_page`)."""

    def initialize(self, dask_server: Any = None) -> None:
        self.scheduler = dask_server

    async def get(self) -> None:
        pools = await collect_status(self.scheduler)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(render_page(pools))


class StatusJson(StatusPage):
    """``GET /daskqueue/status.json``: ``{"generated_at": epoch seconds, "pools": [...]}``."""

    async def get(self) -> None:
        pools = await collect_status(self.scheduler)
        self.set_header("Cache-Control", "no-store")
        self.write({"generated_at": time.time(), "pools": pools})


#: For Dask's ``distributed.scheduler.http.routes`` configuration (add ``daskqueue.status``
#: to that list to have the page from the scheduler's start, under its dashboard prefix).
routes: list[tuple[str, type, dict[str, Any]]] = [
    (PAGE_PATH.lstrip("/") + "/?", StatusPage, {}), (JSON_PATH.lstrip("/"), StatusJson, {})]


async def _install_on_scheduler(dask_scheduler: Any) -> None:
    from distributed.protocol.pickle import dumps

    if dask_scheduler not in _installed:  # marked before the await: installs may overlap
        _installed.add(dask_scheduler)
        dask_scheduler.http_application.add_handlers(
            r".*$", [("/" + path, cls, {"dask_server": dask_scheduler}) for path, cls, _ in routes])
        logger.info("daskqueue status page at %s on the scheduler's HTTP server", PAGE_PATH)
    plugin = StatusWorkerPlugin()  # idempotent: registered once per scheduler
    await dask_scheduler.register_worker_plugin(None, dumps(plugin), plugin.name, idempotent=True)


# -- gathering (on the scheduler) --------------------------------------------------------------


async def collect_status(scheduler: Any, *, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """A pool stats dict per registered pool, by name; each worker holding their actors is
    asked once, all at once, each within ``timeout_s``. Runs on the scheduler's event loop."""
    pools = scheduler.get_metadata(keys=[POOLS_KEY], default={}) or {}
    consumers = scheduler.get_metadata(keys=[CONSUMERS_KEY], default={}) or {}
    entries = {name: entry for name, entry in pools.items() if entry}
    consumer_refs = {name: [r for refs in (consumers.get(name) or {}).values() if refs for r in refs]
                     for name in entries}
    addresses = sorted({ref[1] for e in entries.values() for ref in e["queues"].values()}
                       | {ref[1] for refs in consumer_refs.values() for ref in refs})
    answers = await asyncio.gather(*(_ask_worker(scheduler, a, timeout_s) for a in addresses))
    snaps = dict(zip(addresses, answers))
    return [pool_status(name, entries[name], consumer_refs[name], snaps) for name in sorted(entries)]


async def _ask_worker(scheduler: Any, address: str, timeout_s: float) -> dict[str, Any]:
    """The worker's :func:`~daskqueue.metrics.snapshot`, or ``{"error": why not}``."""
    if address not in scheduler.workers:
        return {"error": "its worker left the cluster"}
    try:
        snap = await asyncio.wait_for(scheduler.rpc(address).daskqueue_status(), timeout_s)
    except asyncio.TimeoutError:
        return {"error": f"its worker did not answer within {timeout_s:g} s"}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if not isinstance(snap, dict):  # a worker without the handler answers None
        return {"error": "its worker has no daskqueue status handler"}
    return snap


def pool_status(name: str, entry: dict[str, Any], consumer_refs: list[Any],
                snaps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One pool's stats dict from its registry entry and the workers' snapshots (pure)."""
    queues = [_row(snaps, ref, "queues", {"index": int(i)}) for i, ref in entry["queues"].items()]
    consumers = [_row(snaps, ref, "consumers", {"index": None}) for ref in consumer_refs]
    return {"name": name, "durability": entry.get("durability"),
            "queues": sorted(queues, key=lambda r: r["index"]),
            "consumers": sorted(consumers, key=lambda r: (r["index"] is None, r["index"] or 0))}


def _row(snaps: dict[str, dict[str, Any]], ref: Any, kind: str, base: dict[str, Any]) -> dict[str, Any]:
    address, key = ref[1], ref[2]
    snap = snaps.get(address, {"error": "not asked"})
    row = dict(base, worker=address, key=key)
    if "error" in snap:
        return dict(row, state="unreachable", error=snap["error"])
    found = snap[kind].get(key)
    if found is None:
        return dict(row, state="gone", error="its worker no longer holds it (closed, moved or lost)")
    return dict(row, **found, state="ok")


# -- notebooks: live counts from the client ----------------------------------------------------


def pool_html(queue_pool: Any, timeout_s: float = 2.0) -> str:
    """HTML of a ``QueuePool`` with each queue's live counts, within ``timeout_s`` in all:
    a queue that does not answer in time shows as unreachable."""
    if getattr(queue_pool, "_closed", False):
        return _section(queue_pool.name, "closed", "", "", title="QueuePool")
    targets = [(i, queue_pool.queues[i]) for i in queue_pool.queue_indices]
    rows = []
    for (i, handle), (state, stats) in zip(targets, _call_stats([h for _, h in targets], timeout_s)):
        numbers = {} if stats is None else {
            "ready": stats.ready, "delayed": stats.delayed, "leased": stats.leased, "dead": stats.dead,
            "puts": stats.total_put, "acks": stats.total_acked, "retries": stats.total_retried}
        rows.append({"index": i, "worker": getattr(handle, "_address", None), **state, **numbers})
    pool = {"name": queue_pool.name, "durability": queue_pool.durability, "queues": rows, "consumers": []}
    return render_pool(pool, title="QueuePool")


def consumer_pool_html(consumer_pool: Any, timeout_s: float = 2.0) -> str:
    """HTML of a ``ConsumerPool`` with each consumer's live counts, within ``timeout_s`` in
    all: a consumer that does not answer in time shows as unreachable."""
    handles = list(consumer_pool.consumers)
    options = getattr(consumer_pool, "_options", {})
    slots = options.get("max_concurrency", 1) + options.get("reserved_slots", 0)
    rows = []
    for n, (handle, (state, stats)) in enumerate(zip(handles, _call_stats(handles, timeout_s))):
        numbers = {} if stats is None else {
            "index": stats.index, "busy_slots": metrics.busy_slots(stats.busy_slots, slots), "slots": slots,
            "done": stats.items_done, "failed": stats.items_failed, "batches": stats.batches,
            "duration_count": stats.duration_count, "duration_sum_s": stats.duration_sum_s}
        rows.append({"index": n, "worker": getattr(handle, "_address", None), **state, **numbers})
    name = getattr(getattr(consumer_pool, "queue_pool", None), "name", "")
    pool = {"name": name, "durability": None, "queues": [], "consumers": rows}
    return render_pool(pool, title="ConsumerPool")


def _call_stats(handles: list[Any], timeout_s: float) -> list[tuple[dict[str, Any], Any]]:
    """``stats()`` of every handle: all calls first, then each waited for with what is left
    of one deadline. ``({"state": ...}, stats or None)`` per handle, in order; never raises."""
    deadline = time.monotonic() + timeout_s
    futures = []
    for handle in handles:
        try:
            futures.append(handle.stats())
        except Exception as e:
            futures.append(e)
    out = []
    for future in futures:
        if isinstance(future, Exception):
            out.append(({"state": "error", "error": f"{type(future).__name__}: {future}"}, None))
            continue
        left = deadline - time.monotonic()
        try:
            if left <= 0 and not future.done():
                raise TimeoutError
            out.append(({"state": "ok"}, future.result(timeout=max(left, 0.001))))
        except _TIMEOUTS:
            out.append(({"state": "unreachable", "error": f"no answer within {timeout_s:g} s"}, None))
        except Exception as e:
            out.append(({"state": "error", "error": f"{type(e).__name__}: {e}"}, None))
    return out


# -- rendering (pure) --------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table.daskqueue { border-collapse: collapse; margin: 0.3em 0 1em; }
table.daskqueue th, table.daskqueue td { padding: 0.2em 0.7em; border-bottom: 1px solid #ddd; }
table.daskqueue td.n, table.daskqueue th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.daskqueue tr.total td { font-weight: bold; border-top: 2px solid #999; }
h2 small { font-size: 0.65em; font-weight: normal; color: #666; }
.unreachable, .error, .gone { color: #b00; }
"""


def render_page(pools: list[dict[str, Any]], *, refresh_s: int = REFRESH_S,
                generated_at: float | None = None) -> str:
    """The whole status page: a section per pool, reloading every ``refresh_s`` seconds."""
    stamp = time.strftime("%H:%M:%S", time.localtime(generated_at if generated_at is not None else time.time()))
    body = "".join(render_pool(p) for p in pools) or "<p>No daskqueue pools are registered on this scheduler.</p>"
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"refresh\" content=\"{int(refresh_s)}\"><title>daskqueue</title>"
        f"<style>{_STYLE}</style></head><body><h1>daskqueue</h1>"
        f"<p>Updated {stamp}, every {int(refresh_s)} s &middot; <a href=\"{JSON_PATH}\">JSON</a> &middot; "
        f"<a href=\"/status\">Dask dashboard</a></p>{body}</body></html>"
    )


def render_pool(pool: dict[str, Any], *, title: str = "Pool") -> str:
    """One pool's section: its queues' table (with totals) and its consumers' table."""
    meta = ", ".join(x for x in (pool.get("durability"), f"{len(pool['queues'])} queues" if pool["queues"] else "",
                                 f"{len(pool['consumers'])} consumers" if pool["consumers"] else "") if x)
    queues = _table("queues", "queue", pool["queues"], QUEUE_COLUMNS, total=True) if pool["queues"] else ""
    consumers = [dict(c, mean_task_ms=_mean_ms(c)) for c in pool["consumers"]]
    ctable = _table("consumers", "consumer", consumers, CONSUMER_COLUMNS, total=True) if consumers else ""
    return _section(pool["name"], meta, queues, ctable, title=title)


def _section(name: str, meta: str, queues: str, consumers: str, *, title: str = "Pool") -> str:
    return (f"<div class=\"daskqueue-pool\" data-pool=\"{html.escape(name)}\"><h2>{title} "
            f"<code>{html.escape(name)}</code> <small>{html.escape(meta)}</small></h2>{queues}{consumers}</div>")


def _mean_ms(row: dict[str, Any]) -> float | None:
    count = row.get("duration_count")
    return 1000 * row["duration_sum_s"] / count if count else None


def _table(kind: str, what: str, rows: list[dict[str, Any]], columns: list[tuple[str, str]], *,
           total: bool) -> str:
    cols = [(f, h) for f, h in columns if any(r.get(f) is not None for r in rows)]
    head = (f"<tr><th>{what}</th><th>worker</th><th>state</th>"
            + "".join(f"<th class=\"n\">{html.escape(h)}</th>" for _, h in cols) + "</tr>")
    body = "".join(_tr(r, cols) for r in rows)
    if total and len(rows) > 1:
        ok = [r for r in rows if r.get("state") == "ok"]
        sums = {f: sum(r[f] for r in ok if r.get(f) is not None) for f, _ in cols if f != "mean_task_ms"}
        if any(f == "mean_task_ms" for f, _ in cols):
            sums["mean_task_ms"] = _mean_ms({f: sum(r.get(f) or 0 for r in ok)
                                             for f in ("duration_count", "duration_sum_s")})
        body += _tr({"index": "total", "worker": "", "state": f"{len(ok)} of {len(rows)} ok", **sums}, cols,
                    cls="total")
    return f"<table class=\"daskqueue {kind}\"><thead>{head}</thead><tbody>{body}</tbody></table>"


def _tr(row: dict[str, Any], cols: Iterable[tuple[str, str]], cls: str = "") -> str:
    state = str(row.get("state", ""))
    state_cls = "summary" if cls == "total" else state
    title = f" title=\"{html.escape(row['error'])}\"" if row.get("error") else ""
    index = row.get("index")
    cells = "".join(f"<td class=\"n\" data-col=\"{f}\">{_num(row.get(f))}</td>" for f, _ in cols)
    return (f"<tr class=\"{cls}\" data-index=\"{html.escape(str(index))}\">"
            f"<td>{html.escape('' if index is None else str(index))}</td>"
            f"<td>{html.escape(str(row.get('worker') or ''))}</td>"
            f"<td class=\"{html.escape(state_cls)}\"{title}>{html.escape(state)}</td>{cells}</tr>")


def _num(x: Any) -> str:
    if x is None:
        return "&ndash;"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return f"{x:,}"
