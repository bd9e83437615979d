"""daskqueue 0.2.0's module paths: ``daskqueue.QueuePool``, ``daskqueue.ConsumerPool``,
``daskqueue.Consumer``, ``daskqueue.Protocol``, ``daskqueue.queue.base_queue``,
``daskqueue.queue.transient_queue`` and ``daskqueue.queue.durable_queue``.

Each is a thin module whose names warn once (for the module) when first taken, at the
user's line (``from daskqueue.QueuePool import QueuePool``), and give today's objects.

Two of them, ``daskqueue.QueuePool`` and ``daskqueue.ConsumerPool``, share their names with
the package's classes. Importing a submodule binds it as an attribute of its package, so a
first ``import daskqueue.QueuePool`` would put the module where the class
``daskqueue.QueuePool`` is. :func:`register` therefore loads those two when ``daskqueue`` is
imported, into ``sys.modules`` only (not as attributes): a later import finds them there
and binds nothing.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["register"]

#: The 0.2.0 modules named like a class of the package.
SHADOWING = ("daskqueue.QueuePool", "daskqueue.ConsumerPool")


def register() -> None:
    """Load the :data:`SHADOWING` modules into ``sys.modules`` without binding them."""
    for name in SHADOWING:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:  # pragma: no cover - a broken install
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
