"""Fixtures shared by unit tests of the local backend's process handling."""

from __future__ import annotations

import pytest

from harness.backends.local import process


@pytest.fixture
def cluster_dir(tmp_path):
    """An empty cluster directory; whatever the test started in it is stopped afterwards."""
    directory = tmp_path / "clusters" / "unit"
    directory.mkdir(parents=True)
    yield directory
    process.stop_all(directory, grace_seconds=2)
