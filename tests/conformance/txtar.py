"""A parser for the txtar archive format used by Cilium's script tests.

An archive is a free-text comment (here: the script) followed by files, each
introduced by a marker line ``-- name --``. Everything up to the next marker (or
the end) is the file's content, verbatim. The format has no escaping: a line that
looks like a marker always starts a new file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_MARKER = re.compile(r"^-- (\S.*?) --[ \t]*$")


@dataclass(frozen=True, slots=True)
class Archive:
    """A parsed archive: the leading comment and the files in order of appearance."""

    comment: str
    files: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> Archive:
    """Split ``text`` into the comment and its ``-- name --`` files.

    A file named twice keeps its last content (as the upstream extractor would
    overwrite it). Line endings are kept as they are.
    """
    lines = text.splitlines(keepends=True)
    comment: list[str] = []
    files: dict[str, str] = {}
    current: list[str] | None = None
    name = ""
    for line in lines:
        m = _MARKER.match(line.rstrip("\r\n"))
        if m is not None:
            if current is not None:
                files[name] = "".join(current)
            name = m.group(1).strip()
            current = []
            continue
        if current is None:
            comment.append(line)
        else:
            current.append(line)
    if current is not None:
        files[name] = "".join(current)
    return Archive("".join(comment), files)


def parse_file(path: str | Path) -> Archive:
    """Parse the archive stored at ``path``."""
    return parse(Path(path).read_text(encoding="utf-8"))


def extract(archive: Archive, workdir: Path) -> None:
    """Write every file of ``archive`` under ``workdir`` (creating sub-directories).

    Names that would escape ``workdir`` (absolute or with ``..``) are rejected.
    """
    root = workdir.resolve()
    for name, data in archive.files.items():
        target = (root / name).resolve()
        if root != target and root not in target.parents:
            raise ValueError(f"archive file {name!r} points outside the work directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data, encoding="utf-8")
