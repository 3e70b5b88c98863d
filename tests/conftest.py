"""How the suite shares a machine when pytest-xdist runs it on several workers (``make test``: ``-n 2
--dist loadfile``, a file's tests on one worker, so a module's server or page is started once).

Each worker computes on one thread (its subprocesses too, through ``OMP_NUM_THREADS``): two workers of
two threads each on two cores spend their time waiting for each other.  The files that take longest
are handed out first, so that no worker is left with one of them at the end while the others idle."""
from __future__ import annotations

import os

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
