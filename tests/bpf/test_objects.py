"""The compiled BPF objects are found in one directory: $STATEWRIGHT_BPF_OBJECTS, else the
checkout's build/; a missing one is an error naming where it was looked for and why."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from bpf import objects
from bpf.datapath import DatapathConfig, DatapathError, SockLB, cgroup2_mount
from bpf.lxc import EndpointPrograms, LxcConfig


def test_the_checkout_build_directory_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(objects.OBJECTS_ENV, raising=False)
    assert objects.objects_dir() == objects.CHECKOUT_BUILD
    assert objects.object_path("lxc.o") == str(objects.CHECKOUT_BUILD / "lxc.o")
    assert objects.in_checkout()  # the tests run from the checkout
    message = objects.missing_object_message(objects.object_path("nothing.o"))
    assert str(objects.CHECKOUT_BUILD) in message and "make setup" in message


def test_the_configured_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(objects.OBJECTS_ENV, str(tmp_path))
    assert objects.objects_dir() == tmp_path
    path = objects.object_path("sock_lb.o")
    assert path == str(tmp_path / "sock_lb.o")
    message = objects.missing_object_message(path)
    assert f"looked in {tmp_path}" in message and f"${objects.OBJECTS_ENV}={tmp_path}" in message


def test_an_installed_package_names_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """Outside a checkout (no pyproject.toml beside the package) the message says which
    variable to set and which objects the directory must hold."""
    monkeypatch.delenv(objects.OBJECTS_ENV, raising=False)
    site = tmp_path / "site-packages"
    monkeypatch.setattr(objects, "CHECKOUT_BUILD", site / "build")
    assert not objects.in_checkout()
    message = objects.missing_object_message(str(site / "build" / "sock_lb.o"))
    assert f"set ${objects.OBJECTS_ENV}" in message and "nodeport.o" in message


def test_loading_a_missing_object_names_where_it_looked(tmp_path: Path) -> None:
    """Both program loaders refuse a missing object with that message (before any kernel
    call: no privileges needed)."""
    missing = str(tmp_path / "lxc.o")
    with pytest.raises(DatapathError, match=f"object {missing} not found") as ei:
        EndpointPrograms(LxcConfig(pin_dir=str(tmp_path), object_path=missing)).load()
    assert ei.value.errno == errno.ENOENT
    try:
        root = cgroup2_mount()
    except DatapathError:
        return  # no cgroup2 here: the socket LB's check comes after the cgroup's
    missing = str(tmp_path / "sock_lb.o")
    config = DatapathConfig(cgroup=root, pin_dir=str(tmp_path), object_path=missing,
                            allow_root_cgroup=True)
    with pytest.raises(DatapathError, match=f"object {missing} not found"):
        SockLB(config).attach()
