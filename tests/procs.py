"""Reading a process's children from /proc, for tests that must find what a run started."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The children of every thread of ``pid``.

    A thread, or the whole process, can end between listing its tasks and reading one of
    them: it then has no children left to list, so it is skipped rather than raising."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.extend(int(c) for c in text.split())
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children before their own children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found
