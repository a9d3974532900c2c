"""Example: reconcile a table of (name, text) rows into the files of a directory."""

import dataclasses
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from reconciler import Config, Reconciler, Status, status_pending
from statedb import DB, Index, ReadTxn, Table


@dataclasses.dataclass(frozen=True, slots=True)
class File:
    """A row: the file's name and text, and its reconciliation status."""

    name: str
    text: str
    status: Status = dataclasses.field(default_factory=status_pending)


class Directory:
    """The target: one file per row; prune removes every file no row asks for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def update(self, txn: ReadTxn, revision: int, f: File) -> None:
        (self.root / f.name).write_text(f.text)

    def delete(self, txn: ReadTxn, revision: int, f: File) -> None:
        (self.root / f.name).unlink(missing_ok=True)

    def prune(self, txn: ReadTxn, files: Iterator[File]) -> None:
        wanted = {f.name for f in files}
        for p in self.root.iterdir():
            if p.name not in wanted:
                p.unlink()


async def main(root: Path) -> None:
    """Reconcile a small table into ``root`` and check the directory matches it."""
    files: Table[File] = Table("files", Index("name", key=lambda f: f.name))
    db = DB(files)
    rec = Reconciler(db, Config(
        files, Directory(root), get_object_status=lambda f: f.status,
        set_object_status=lambda f, s: dataclasses.replace(f, status=s), prune_interval=60.0,
    ))
    (root / "stray.txt").write_text("no row asks for me")
    async with anyio.create_task_group() as tg:
        await tg.start(rec.run)  # no initializers: the first round prunes stray.txt
        with db.write_txn(files) as txn:
            files.insert(txn, File("a.txt", "hello"))
            files.insert(txn, File("b.txt", "world"))
        with db.write_txn(files) as txn:
            files.delete(txn, File("b.txt", ""))
        await rec.wait_until_reconciled(files.revision(db.read_txn()), timeout=10)
        names = sorted(p.name for p in root.iterdir())
        print(names, (root / "a.txt").read_text(), rec.health.message)
        assert names == ["a.txt"], f"target does not match the table: {names}"
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        anyio.run(main, Path(d))
