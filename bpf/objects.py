"""Where the compiled BPF objects are: one directory for all of them.

``make setup`` compiles bpf/*.c into ``sock_lb.o`` (the socket load balancer), ``lxc.o``
(the endpoint tc programs), ``nodeport.o`` (the north-south tc programs) and ``maps.o``
(every map's types as BTF) in the checkout's ``build/``. They are found in one directory:
``$STATEWRIGHT_BPF_OBJECTS`` when set, else the ``build/`` beside the ``bpf`` package,
which is the checkout's in a checkout or an editable install. A non-editable install (the
package in site-packages) has no ``build/`` of its own: it points
``$STATEWRIGHT_BPF_OBJECTS`` at the directory holding the objects. A missing object is an
error that names the directory it was looked for in, why that one, and how to point
elsewhere (`missing_object_message`).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the directory that holds the compiled objects.
OBJECTS_ENV = "STATEWRIGHT_BPF_OBJECTS"
#: The directory beside the ``bpf`` package where ``make setup`` compiles the objects.
CHECKOUT_BUILD = Path(__file__).resolve().parents[1] / "build"
#: The objects ``make setup`` builds.
OBJECT_NAMES = ("sock_lb.o", "lxc.o", "nodeport.o", "maps.o")


def objects_dir() -> Path:
    """``$STATEWRIGHT_BPF_OBJECTS`` when set, else the checkout's ``build/``."""
    configured = os.environ.get(OBJECTS_ENV, "")
    return Path(configured) if configured else CHECKOUT_BUILD


def object_path(name: str) -> str:
    """The path of the object ``name`` (e.g. ``sock_lb.o``) in `objects_dir`."""
    return str(objects_dir() / name)


def in_checkout() -> bool:
    """Whether the ``bpf`` package sits in a source checkout (its pyproject.toml beside it)
    rather than in an installed environment."""
    return (CHECKOUT_BUILD.parent / "pyproject.toml").is_file()


def missing_object_message(path: str) -> str:
    """Why the object at ``path`` is not there and what to do: the directory looked in,
    where that directory came from, and the setting that points elsewhere."""
    directory = Path(path).parent
    configured = os.environ.get(OBJECTS_ENV, "")
    if configured and directory == Path(configured):
        why = f"${OBJECTS_ENV}={configured}"
    elif directory == CHECKOUT_BUILD and in_checkout():
        why = f"the checkout's build/ (make setup compiles it there; ${OBJECTS_ENV} unset)"
    elif directory == CHECKOUT_BUILD:
        why = (f"${OBJECTS_ENV} unset, and this installed package has no build/ of its "
               f"own: set ${OBJECTS_ENV} to the directory holding {', '.join(OBJECT_NAMES)}")
    else:
        why = "the configured object path"
    return f"object {path} not found (looked in {directory}: {why})"
