"""Watch channels: which commits close which query watches, and waiting on them from
threads and from anyio tasks on the asyncio and trio backends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import anyio
import pytest

from statedb import DB, Table, Watch, WatchSet, closed_watch
from tests.statedb.helpers import OBJ1, OBJ2, PREFIX_INDEX, TAGS_INDEX, Obj, new_db, obj
from tests.statedb.test_db_script import net_prefix

#: Upper bound on any wait that is expected to end; it only keeps a broken test from hanging.
HANG_GUARD_S = 30.0


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every anyio test on both backends."""
    backend: str = request.param
    return backend


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the anyio backend fixture with asyncio and trio."""
    if "anyio_backend" in metafunc.fixturenames:
        metafunc.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)


@pytest.fixture
def db_t1() -> tuple[DB, Table[Obj]]:
    """A DB with one table holding OBJ1 and OBJ2."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    return db, t1


def commit(db: DB, t: Table[Obj], *rows: Obj, delete: tuple[Obj, ...] = ()) -> None:
    """Insert ``rows`` and delete ``delete`` in one committed transaction."""
    with db.write_txn(t) as txn:
        for r in rows:
            t.insert(txn, r)
        for r in delete:
            t.delete(txn, r)


def test_watch_basics() -> None:
    """A watch closes once; waiting on a closed watch returns at once; a timeout returns False."""
    w = Watch()
    assert not w.closed and "open" in repr(w)
    assert w.wait(0.01) is False
    w.close()
    w.close()
    assert w.closed and w.wait() is True and "closed" in repr(w)
    assert closed_watch().closed
    calls: list[int] = []
    w2 = Watch()
    assert w2.add_callback(lambda: calls.append(1))
    cb: Callable[[], None] = lambda: calls.append(2)  # noqa: E731
    w2.add_callback(cb)
    w2.remove_callback(cb)
    w2.remove_callback(cb)  # removing twice is a no-op
    w2.close()
    assert calls == [1]
    assert w2.add_callback(lambda: calls.append(3)) is False


def test_get_watch_closes_on_change_of_its_key_only(db_t1: tuple[DB, Table[Obj]]) -> None:
    """The watch of get(key) closes when that row changes, after commit; not for other keys."""
    db, t1 = db_t1
    row, w1 = t1.get_watch(db.read_txn(), 1)
    _, w2 = t1.get_watch(db.read_txn(), 2)
    _, w_absent = t1.get_watch(db.read_txn(), 3)
    assert row is OBJ1 and not w1.closed
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(1, "10.0.0.0/8", "changed"))
        assert not w1.closed  # not before commit
    assert w1.closed and not w2.closed and not w_absent.closed
    commit(db, t1, obj(3))
    assert w_absent.closed and not w2.closed
    commit(db, t1, delete=(OBJ2,))
    assert w2.closed


def test_watches_never_close_on_abort(db_t1: tuple[DB, Table[Obj]]) -> None:
    """Aborted writes close no watch of any query kind."""
    db, t1 = db_t1
    txn = db.read_txn()
    watches = [
        t1.get_watch(txn, 1)[1],
        t1.list_watch(txn, TAGS_INDEX.query("foo"))[1],
        t1.prefix_watch(txn, TAGS_INDEX.query("b"))[1],
        t1.lower_bound_watch(txn, 0)[1],
        t1.all_watch(txn)[1],
    ]
    wtxn = db.write_txn(t1)
    t1.insert(wtxn, obj(1, None, "x"))
    t1.delete(wtxn, OBJ2)
    t1.insert(wtxn, obj(9, None, "foo"))
    wtxn.abort()
    with pytest.raises(ValueError), db.write_txn(t1) as wtxn2:
        t1.delete_all(wtxn2)
        raise ValueError("abort via exception")
    assert not any(w.closed for w in watches)
    commit(db, t1, obj(1, None, "bar", "foo"))
    assert all(w.closed for w in watches)


def test_list_and_prefix_watches(db_t1: tuple[DB, Table[Obj]]) -> None:
    """list(key) watches its key; prefix(p) watches every key starting with p."""
    db, t1 = db_t1
    txn = db.read_txn()
    _, w_foo = t1.list_watch(txn, TAGS_INDEX.query("foo"))
    _, w_bar = t1.list_watch(txn, TAGS_INDEX.query("bar"))
    _, w_pb = t1.prefix_watch(txn, TAGS_INDEX.query("b"))
    _, w_pq = t1.prefix_watch(txn, TAGS_INDEX.query("q"))
    _, w_net = t1.prefix_watch(txn, PREFIX_INDEX.query_bytes(net_prefix("10.1.0.0/16")))
    _, w_net6 = t1.prefix_watch(txn, PREFIX_INDEX.query_bytes(net_prefix("2001:db8::/32")))
    # A new row tagged "bat" only: under prefix "b", not list "foo"/"bar" nor prefix "q".
    commit(db, t1, obj(3, "192.168.0.0/16", "bat"))
    assert w_pb.closed
    assert not w_foo.closed and not w_bar.closed and not w_pq.closed
    assert not w_net.closed and not w_net6.closed
    # Retagging row 2 from baz/foo to qux: its old keys and its new key change, and so
    # does the row found under its (unchanged) network.
    commit(db, t1, obj(2, "10.1.2.3/32", "qux"))
    assert w_foo.closed and w_pq.closed and w_net.closed
    assert not w_bar.closed and not w_net6.closed
    _, w_net = t1.prefix_watch(db.read_txn(), PREFIX_INDEX.query_bytes(net_prefix("10.1.0.0/16")))
    commit(db, t1, obj(4, "10.1.200.0/24"))
    assert w_net.closed and not w_net6.closed and not w_bar.closed


def test_table_watches_close_on_any_change(db_t1: tuple[DB, Table[Obj]]) -> None:
    """all() and lower_bound() watches close when anything in the table changes."""
    db, t1 = db_t1
    rows, w_all = t1.all_watch(db.read_txn())
    assert list(rows) == [OBJ1, OBJ2]
    lb_rows, w_lb = t1.lower_bound_watch(db.read_txn(), 2)
    assert list(lb_rows) == [OBJ2]
    commit(db, t1, obj(1, None, "x"))
    assert w_all.closed and w_lb.closed


def test_stale_snapshot_gets_closed_watches(db_t1: tuple[DB, Table[Obj]]) -> None:
    """Queries on a snapshot older than the latest commit return closed watches when their
    result may differ from the latest, so a caller never waits on a change already made."""
    db, t1 = db_t1
    old = db.read_txn()
    commit(db, t1, obj(1, None, "x"))
    assert t1.get_watch(old, 1)[1].closed
    assert t1.all_watch(old)[1].closed
    assert t1.lower_bound_watch(old, 0)[1].closed
    assert t1.prefix_watch(old, TAGS_INDEX.query("b"))[1].closed
    assert t1.list_watch(old, TAGS_INDEX.query("foo"))[1].closed


def test_write_txn_watch_closes_at_its_own_commit(db_t1: tuple[DB, Table[Obj]]) -> None:
    """A watch taken inside a write transaction closes when that transaction commits a change."""
    db, t1 = db_t1
    with db.write_txn(t1) as txn:
        _, w = t1.get_watch(txn, 1)
        _, w_other = t1.get_watch(txn, 2)
        t1.insert(txn, obj(1, None, "y"))
        assert not w.closed
    assert w.closed and not w_other.closed


def test_other_tables_do_not_close_watches() -> None:
    """A commit to one table leaves watches on another table open."""
    db, (t1, t2) = new_db("t1", "t2")
    _, w = t1.all_watch(db.read_txn())
    commit(db, t2, OBJ1)
    assert not w.closed


def test_wait_from_threads(db_t1: tuple[DB, Table[Obj]]) -> None:
    """Several threads blocked on one watch all wake up on commit."""
    db, t1 = db_t1
    _, w = t1.get_watch(db.read_txn(), 1)
    woke: list[bool] = []
    lock = threading.Lock()
    started = threading.Barrier(5)

    def waiter() -> None:
        started.wait(HANG_GUARD_S)
        ok = w.wait(HANG_GUARD_S)
        with lock:
            woke.append(ok)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for th in threads:
        th.start()
    started.wait(HANG_GUARD_S)
    commit(db, t1, obj(1, None, "z"))
    for th in threads:
        th.join(HANG_GUARD_S)
    assert woke == [True] * 4


def test_watch_set_from_a_thread(db_t1: tuple[DB, Table[Obj]]) -> None:
    """WatchSet.wait returns the closed watches, or [] when the timeout passes first."""
    db, t1 = db_t1
    ws = WatchSet()
    assert ws.wait(0) == []  # empty set: nothing to wait for
    _, w1 = t1.get_watch(db.read_txn(), 1)
    _, w2 = t1.get_watch(db.read_txn(), 2)
    ws.add(w1, w2)
    assert len(ws) == 2
    assert ws.wait(0.01) == []
    th = threading.Thread(target=commit, args=(db, t1, obj(2, None, "q")))
    th.start()
    assert ws.wait(HANG_GUARD_S) == [w2]
    th.join(HANG_GUARD_S)
    assert WatchSet([w1, w2]).wait() == [w2]  # an already closed member returns at once
    ws.clear()
    assert len(ws) == 0


@pytest.mark.anyio
async def test_wait_async_woken_by_a_task(db_t1: tuple[DB, Table[Obj]]) -> None:
    """An anyio task waiting on a watch wakes when another task of the loop commits."""
    db, t1 = db_t1
    _, w = t1.get_watch(db.read_txn(), 1)
    woke = anyio.Event()

    async def waiter() -> None:
        await w.wait_async()
        woke.set()

    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0)
            assert not woke.is_set()
            commit(db, t1, obj(1, None, "a"))
            await woke.wait()
    await w.wait_async()  # closed: returns at once


@pytest.mark.anyio
async def test_wait_async_woken_by_a_thread(db_t1: tuple[DB, Table[Obj]]) -> None:
    """A commit made in a worker thread wakes a task waiting in the event loop."""
    db, t1 = db_t1
    rows, w = t1.all_watch(db.read_txn())
    assert len(list(rows)) == 2
    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.wait_async)
            await anyio.to_thread.run_sync(commit, db, t1, obj(5))
    assert w.closed


@pytest.mark.anyio
async def test_watch_set_async(db_t1: tuple[DB, Table[Obj]]) -> None:
    """WatchSet.wait_async returns [] on timeout and the closed watches otherwise."""
    db, t1 = db_t1
    _, w1 = t1.get_watch(db.read_txn(), 1)
    _, w2 = t1.prefix_watch(db.read_txn(), TAGS_INDEX.query("z"))
    ws = WatchSet([w1, w2])
    assert await ws.wait_async(0.01) == []
    assert await WatchSet().wait_async() == []
    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, commit, db, t1, obj(7, None, "zz"))
            assert await ws.wait_async() == [w2]
    assert await ws.wait_async(0) == [w2]


@pytest.mark.anyio
async def test_watch_set_timeout_already_past_and_no_waiter_left() -> None:
    """A zero or negative timeout returns [] at once (no error on either backend), and a
    wait that timed out leaves no callback on the watch: a later close wakes only the
    live waiter."""
    w = Watch()
    with anyio.fail_after(HANG_GUARD_S):
        assert await WatchSet([w]).wait_async(-1.0) == []
        assert await WatchSet([w]).wait_async(0) == []
        assert await WatchSet([w]).wait_async(0.01) == []
    calls: list[str] = []
    w.add_callback(lambda: calls.append("live"))
    w.close()
    assert calls == ["live"]


@pytest.mark.anyio
async def test_cancelled_wait_leaves_no_waiter_behind(db_t1: tuple[DB, Table[Obj]]) -> None:
    """Cancelling a wait unregisters it: a later close (from a thread) wakes nobody stale."""
    db, t1 = db_t1
    _, w = t1.get_watch(db.read_txn(), 1)
    with anyio.move_on_after(0.01):
        await w.wait_async()
    assert not w.closed
    calls: list[str] = []
    w.add_callback(lambda: calls.append("live"))
    await anyio.to_thread.run_sync(commit, db, t1, obj(1, None, "c"))
    assert w.closed and calls == ["live"]


def _rows(it: Iterator[Obj]) -> list[int]:
    return [r.id for r in it]


def test_watch_results_match_snapshot(db_t1: tuple[DB, Table[Obj]]) -> None:
    """The *_watch variants return the same rows as the plain queries."""
    db, t1 = db_t1
    txn = db.read_txn()
    assert _rows(t1.prefix_watch(txn, TAGS_INDEX.query("ba"))[0]) == [1, 2]
    assert _rows(t1.list_watch(txn, TAGS_INDEX.query("bar"))[0]) == [1]
    assert _rows(t1.lower_bound_watch(txn, 2)[0]) == [2]
    assert t1.get_watch(txn, 2)[0] is OBJ2
