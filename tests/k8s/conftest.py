"""Fixtures of the Kubernetes tests: a running fake API server, a kubeconfig for it, and
the official client (a test dependency: it keeps the fake honest) pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import kubernetes.config
import pytest
import urllib3

from .fake_apiserver import FakeAPIServer


@pytest.fixture
def kubeconfig(apiserver: FakeAPIServer, tmp_path: Path) -> str:
    """A kubeconfig with the server's CA and current token (inline)."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def custom(kubeconfig: str) -> Iterator[kubernetes.client.CustomObjectsApi]:
    """The official client's CustomObjectsApi against the fake."""
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=kubeconfig, client_configuration=cfg, persist_config=False
    )
    cfg.retries = urllib3.Retry(total=2, status=0, respect_retry_after_header=False)
    client = kubernetes.client.ApiClient(cfg)
    try:
        yield kubernetes.client.CustomObjectsApi(client)
    finally:
        client.close()
