"""Task functions of the slurm lane, importable on the jobs' workers (one argument each, for map)."""

from __future__ import annotations

from tests import tasks


def logged_sleep_5ms(arg):
    x, log = arg
    return tasks.logged_sleep(x, 0.005, log)


def logged_sleep_25ms(arg):
    x, log = arg
    return tasks.logged_sleep(x, 0.025, log)
