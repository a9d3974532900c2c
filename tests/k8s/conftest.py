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
def api(kubeconfig: str) -> Iterator[kubernetes.client.ApiClient]:
    """The official client configured from the kubeconfig."""
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=kubeconfig, client_configuration=cfg, persist_config=False
    )
    # urllib3 would retry a 429 with Retry-After by itself; these tests look at each reply.
    cfg.retries = urllib3.Retry(total=2, status=0, respect_retry_after_header=False)
    client = kubernetes.client.ApiClient(cfg)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def custom(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    """The official client's CustomObjectsApi against the fake."""
    return kubernetes.client.CustomObjectsApi(api)
