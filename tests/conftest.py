"""How the suite shares a machine when pytest-xdist runs it on several workers (``make test``: ``-n 2
--dist loadfile``, a file's tests on one worker, so a module's server or page is started once).

Each worker computes on one thread (its subprocesses too, through ``OMP_NUM_THREADS``): two workers of
two threads each on two cores spend their time waiting for each other.  The files that take longest
are handed out first, so that no worker is left with one of them at the end while the others idle.

The suite writes some 8 GB of checkpoints over a run; kept to its end they can fill a small disk.  A test's
``tmp_path`` goes when it passes (``tmp_path_retention_policy`` in pyproject.toml); what a module's fixtures
made with ``tmp_path_factory`` goes once the module's fixtures are torn down (none here outlives its module),
unless one of its tests failed."""
from __future__ import annotations

import os
import shutil

import pytest

#: the longest files, longest first (measured with --durations on 2 cores); the rest keep their order
LONGEST_FIRST = ("test_web_page.py", "test_exactness.py", "test_comfyui.py", "test_static_path.py",
                 "test_load_memory.py", "test_storage.py", "test_tree_drafts.py", "test_head_drafts.py")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: tests keep their order within a file


_made_before: dict[str, set[str]] = {}  # a module's file -> the temporary folders there when it began
_failed: set[str] = set()


def _folders(config) -> set[str] | None:
    factory = getattr(config, "_tmp_path_factory", None)  # pytest's own (its tmp_path plugin)
    if factory is None:
        return None
    return {p.name for p in factory.getbasetemp().iterdir()}


def pytest_runtest_setup(item):
    module = item.nodeid.split("::")[0]
    if module not in _made_before:
        _made_before[module] = _folders(item.config) or set()


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.add(report.nodeid.split("::")[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)  # the module's fixtures are torn down in here when the next test is another module's
    finally:
        module = item.nodeid.split("::")[0]
        if (nextitem is None or nextitem.nodeid.split("::")[0] != module) and module not in _failed:
            before, now = _made_before.pop(module, None), _folders(item.config)
            if before is not None and now is not None:
                base = item.config._tmp_path_factory.getbasetemp()
                for path in (base / name for name in sorted(now - before)):
                    if path.is_symlink():  # pytest's "<name>current" links to the latest of a name
                        path.unlink()
                    else:
                        shutil.rmtree(path, ignore_errors=True)
