"""Fixtures of the Kubernetes tests: a running fake API server and a kubeconfig for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fake_apiserver import FakeAPIServer


@pytest.fixture
def kubeconfig(apiserver: FakeAPIServer, tmp_path: Path) -> str:
    """A kubeconfig with the server's CA and current token (inline)."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
