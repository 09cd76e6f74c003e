"""podman as a CDI consumer, for the tests that run containers with gpuhook's CDI specs
(test_cdi_podman, test_hook_isolation): its command line (PODMAN) and the cdi_specs fixture
(a pytest plugin: tests/conftest.py registers it)."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from gpuhook import cdi

# podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only (no --cdi-spec-dir yet)
CDI_DIR = "/var/run/cdi"
PODMAN = ["podman", "--runtime", "runc", "run", "--rm", "--network", "none",
          # the default RLIMIT_NOFILE is over this machine's hard limit (docs/real-runtimes.md)
          "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


TAG_PREFIX = "gpuhook-test-"  # the copies a test places (one test at a time: the suite runs serially)


@pytest.fixture
def cdi_specs(tmp_path):
    """install(paths) copies spec files into /var/run/cdi under names of this test's own;
    everything is removed at the end (and /var/run/cdi when the test made it)."""
    made_dir = not os.path.isdir(CDI_DIR)
    tag = f"{TAG_PREFIX}{uuid.uuid4().hex[:8]}-"
    placed = []

    def install(paths):
        os.makedirs(CDI_DIR, exist_ok=True)
        for name in os.listdir(CDI_DIR):  # another gpuhook spec there would clash with ours
            assert not cdi.ours(name), f"{CDI_DIR}/{name}: a gpuhook spec is installed on this machine"
            if name.startswith(TAG_PREFIX) and os.path.join(CDI_DIR, name) not in placed:
                os.unlink(os.path.join(CDI_DIR, name))  # a killed run's copy: podman refuses a kind defined twice
        for p in paths:
            dst = os.path.join(CDI_DIR, tag + os.path.basename(p))
            shutil.copy(p, dst)
            placed.append(dst)

    yield install
    for p in placed:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    if made_dir:
        try:
            os.rmdir(CDI_DIR)
        except OSError:
            pass
