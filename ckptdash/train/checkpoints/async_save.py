"""Asynchronous checkpoint saves: stage on the caller's thread, persist in the background.

A synchronous durable save stops training for as long as ``torch.save``, the checksum,
the fsync and the rename take (seconds per GB). Here that stall shrinks to one memory copy:

1. **stage** (the caller's thread, the only part that stalls training): every tensor of
   the state is copied into CPU staging buffers (pinned when the tensors live on CUDA),
   and the containers around them are rebuilt. From the moment :meth:`AsyncSaver.submit`
   returns, the caller may change its tensors: the save holds a snapshot.
2. **persist** (a background thread): the staged copy is written with the same atomic,
   checksummed, fsync'ed write as a synchronous save, around the page cache where the
   filesystem allows it (:mod:`ckptdash.rundir.direct_io`: the CPU a buffered write spends is
   taken from training on busy cores), then ``checkpoint_saved`` is recorded with
   ``blocking_s`` (the stall) beside ``duration_s`` (call to durable).

Staging buffers belong to a :class:`_StagingArea` and are reused by the next save of the
same shapes: allocating (and page-faulting) fresh memory costs more than the copy itself.
There are ``max_in_flight`` areas (1 by default), so at most that many persists are in
flight and the staging memory is that many times the state; a save that finds every area
busy waits for the oldest persist, and that wait counts in its ``blocking_s``. Persists
are written in the order they were submitted, so a later save of a path never loses to an
earlier one.

Each persist runs on its own thread (not a pool, which a forked child would inherit
broken); a thread costs microseconds against a save's seconds.
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptdash.events import CheckpointFailed, CheckpointSaved, CheckpointStarted, Trigger
from ckptdash.rundir import atomic_write
from ckptdash.rundir.door import make_folders
from ckptdash.rundir.writer import EventWriter
from ckptdash.train.checkpoints.saving import record_save, torch_writer

# The persist threads' niceness (see _yield_cpu), the lowest: on a GPU node, where cores are
# mostly idle, niceness costs the persist nothing; where training keeps every core busy (CPU
# training, data loading), the persist takes only what is left rather than slowing the steps
# (benchmarks/async_save.py, buffered writes: 0.86x step throughput during a persist at 19,
# 0.31x at 5; with direct I/O 0.975x). Never SCHED_IDLE: an unprivileged thread can never
# leave that class, so a save the preemption path waits for could crawl at the idle share.
_NICE = 19
# Leaves that cannot change after the call: shared with the snapshot, never copied.
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset)


class SaveHandle:
    """One asynchronous save: :meth:`done` says whether it ended, :meth:`result` waits for it.

    >>> handle = monitor.save_async(state)  # doctest: +SKIP
    >>> handle.result()                     # doctest: +SKIP
    """

    def __init__(self, path: str, trigger: Trigger, step: int | None) -> None:
        self.path = path
        self.trigger = trigger
        self.step = step
        self.monitored: dict[str, float] | None = None
        """What a Lightning ModelCheckpoint monitored at this save (recorded with it)."""
        self.artifact: str | None = None
        """Why the save cannot resume training (recorded with it), None when it can."""
        self.blocking_s = 0.0
        """How long the caller was stalled: waiting for a free staging area, plus staging."""
        self._finished = threading.Event()
        self._saved: CheckpointSaved | None = None
        self._error: BaseException | None = None
        self.retrieved = False
        """True once :meth:`result` reported the outcome (a failure then counts as seen)."""

    @classmethod
    def finished(
        cls, path: str, trigger: Trigger, step: int | None, saved: CheckpointSaved | None = None
    ) -> SaveHandle:
        """A handle for a save that already ended: written synchronously (``saved``), or not
        written by this process at all (ranks other than 0)."""
        handle = cls(path, trigger, step)
        if saved is not None:
            handle.blocking_s = saved.duration_s
        handle._finish(saved, None)
        return handle

    def done(self) -> bool:
        """True once the save is durable and recorded, or has failed."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`done`; False if ``timeout`` passed first. Never raises the error."""
        return self._finished.wait(timeout)

    def result(self, timeout: float | None = None) -> CheckpointSaved | None:
        """Wait until the save is durable; its ``checkpoint_saved`` event (None on a rank
        that writes no events). Raises the save's own error if it failed, or
        :class:`TimeoutError` if ``timeout`` seconds pass first."""
        if not self._finished.wait(timeout):
            raise TimeoutError(
                f"the save of {self.path} was not durable after {timeout:g} s; it is still"
                " being written (call result() again, or result() without a timeout)"
            )
        self.retrieved = True
        if self._error is not None:
            raise self._error
        return self._saved

    @property
    def error(self) -> BaseException | None:
        """The save's error once it failed (None while running or after success)."""
        return self._error if self._finished.is_set() else None

    def _finish(self, saved: CheckpointSaved | None, error: BaseException | None) -> None:
        self._saved, self._error = saved, error
        self._finished.set()


class _StagingArea:
    """CPU buffers one staged copy lives in, kept for the next save of the same shapes.

    Tensors are staged per storage, as ``torch.save`` writes them: tensors that share a
    storage (tied weights, views) share it in the copy too, and the file is the one a
    synchronous save of the original would write. Buffer ``i`` holds the ``i``-th distinct
    storage met while walking the state; it is reused when its size and pinning match.
    """

    def __init__(self) -> None:
        self.buffers: list[Any] = []  # uint8 CPU tensors
        self.reused_bytes = 0
        self.allocated_bytes = 0

    @property
    def nbytes(self) -> int:
        return sum(int(b.numel()) for b in self.buffers)

    def stage(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in this area's buffers (waits for CUDA)."""
        import torch

        self.reused_bytes = self.allocated_bytes = 0
        storages: dict[tuple[str, int], Any] = {}
        devices: set[Any] = set()
        memo: dict[int, Any] = {}

        def storage_copy(t: torch.Tensor) -> Any:
            src = t.untyped_storage()
            key = (str(t.device), src.data_ptr())
            staged = storages.get(key)
            if staged is None:
                nbytes = src.nbytes()
                pin = t.device.type == "cuda"
                i = len(storages)
                buf = self.buffers[i] if i < len(self.buffers) else None
                if buf is None or buf.numel() != nbytes or buf.is_pinned() != pin:
                    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
                    if i < len(self.buffers):
                        self.buffers[i] = buf  # the old buffer is freed here, not kept
                    else:
                        self.buffers.append(buf)
                    self.allocated_bytes += nbytes
                else:
                    self.reused_bytes += nbytes
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
                    src, 0, (nbytes,), (1,)
                )
                buf.copy_(raw, non_blocking=pin)
                if pin:
                    devices.add(t.device)
                staged = buf.untyped_storage()
                storages[key] = staged
            return staged

        def tensor(t: torch.Tensor) -> torch.Tensor:
            plain = type(t) in (torch.Tensor, torch.nn.Parameter)
            if (
                not plain
                or t.layout != torch.strided
                or t.device.type == "meta"
                or t.is_conj()
                or t.is_neg()
                or t.untyped_storage().nbytes() == 0
            ):
                # Rare kinds (sparse, quantized, subclasses, empty): a plain detached copy.
                return t.detach().to("cpu", copy=True)
            out = torch.empty(0, dtype=t.dtype).set_(
                storage_copy(t), t.storage_offset(), t.size(), t.stride()
            )
            if type(t) is torch.nn.Parameter:
                return torch.nn.Parameter(out, requires_grad=t.requires_grad)
            return out.requires_grad_(t.requires_grad) if t.is_leaf else out

        def walk(obj: Any) -> Any:
            if isinstance(obj, _IMMUTABLE):
                return obj
            if id(obj) in memo:
                return memo[id(obj)]
            if isinstance(obj, torch.Tensor):
                out: Any = tensor(obj)
            elif isinstance(obj, dict):
                out = {k: walk(v) for k, v in obj.items()}
                if type(obj) is not dict:
                    # OrderedDict (a state_dict, with its _metadata), AttributeDict, ...:
                    # keep the type and attributes, replace the values.
                    shell = copy.copy(obj)
                    shell.update(out)
                    out = shell
            elif isinstance(obj, list):
                out = [walk(v) for v in obj]
                if type(obj) is not list:
                    seq = copy.copy(obj)
                    seq[:] = out
                    out = seq
            elif isinstance(obj, tuple):
                items = [walk(v) for v in obj]
                out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
            else:
                # Anything else (numpy arrays, small custom objects): a deep copy, so that
                # changing it after the call cannot reach the file either.
                out = copy.deepcopy(obj)
            memo[id(obj)] = out
            return out

        staged = walk(state)
        for device in devices:
            # The copies were queued on the device's stream; the caller may change its
            # tensors once we return, so the snapshot must be complete first.
            torch.cuda.current_stream(device).synchronize()
        return staged


class AsyncSaver:
    """Stages saves on the caller's thread and persists them on background threads, in order.

    ``max_in_flight`` is how many staged copies may wait for or be in their persist at once
    (each one a staging area as large as the state). ``direct_io``: persists write around
    the page cache where the filesystem allows it (:mod:`ckptdash.rundir.direct_io`).
    """

    def __init__(self, *, max_in_flight: int = 1, direct_io: bool = True) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight = {max_in_flight}: must be >= 1")
        self.max_in_flight = max_in_flight
        self.direct_io = direct_io
        self._lock = threading.Condition()
        self._free: list[_StagingArea] = []
        self._areas: list[_StagingArea] = []
        self._handles: list[SaveHandle] = []  # submitted, not yet finished (oldest first)
        self._failed: list[SaveHandle] = []  # failed since the last take_failures()
        self._last_thread: threading.Thread | None = None
        _SAVERS.add(self)

    # --- the caller's side ---------------------------------------------------------------

    def submit(
        self,
        writer: EventWriter | None,
        state: Any,
        path: str | os.PathLike[str],
        *,
        trigger: Trigger,
        step: int | None,
        epoch: int | None = None,
        on_saved: Callable[[CheckpointSaved], None] | None = None,
        fail_on_earlier: bool = False,
        monitored: dict[str, float] | None = None,
        artifact: str | None = None,
    ) -> SaveHandle:
        """Stage ``state`` now, persist it to ``path`` in the background; returns at once.

        Records ``checkpoint_started`` here, and ``checkpoint_saved`` (with ``blocking_s``)
        or ``checkpoint_failed`` when the persist ends. ``on_saved`` runs on the persist's
        thread once the save is durable. An error while staging (out of memory, an object
        that cannot be copied) is recorded and raised here.

        ``fail_on_earlier``: once a staging area is free (with one in flight: the earlier
        save has ended), raise the error of an earlier save nobody retrieved instead of
        staging this one — Lightning's AsyncCheckpointIO behaviour, without its race of a
        failure that is still being written when the next save comes.
        """
        began = time.perf_counter()
        target = Path(os.path.abspath(path))
        handle = SaveHandle(str(target), trigger, step)
        handle.monitored = monitored
        handle.artifact = artifact
        area = self._acquire()
        if fail_on_earlier:
            for failed in self.take_failures():
                self._release(area)
                assert failed.error is not None
                raise failed.error
        try:
            if writer is not None:
                writer.emit(CheckpointStarted, step=step, path=str(target), trigger=trigger)
            make_folders(target.parent)
            staged = area.stage(state)
        except BaseException as exc:
            self._release(area)
            if writer is not None:
                _record_failure(writer, handle, exc)
            raise
        handle.blocking_s = time.perf_counter() - began
        with self._lock:
            previous = self._last_thread
            self._handles.append(handle)
            thread = threading.Thread(
                target=self._persist,
                args=(writer, handle, area, staged, previous, began, epoch, on_saved),
                name=f"ckptdash-persist-{target.name}",
                daemon=True,
            )
            self._last_thread = thread
        try:
            thread.start()
        except BaseException as exc:  # no thread to be had (a process limit): nothing written
            with self._lock:
                self._handles.remove(handle)
                self._last_thread = previous
            self._release(area)
            if writer is not None:
                _record_failure(writer, handle, exc)
            raise
        return handle

    def in_flight(self) -> list[SaveHandle]:
        """The saves submitted and not yet durable or failed, oldest first."""
        with self._lock:
            return list(self._handles)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every save submitted so far is durable or failed (errors stay in the
        handles; see :meth:`take_failures`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for handle in self.in_flight():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not handle.wait(left):
                raise TimeoutError(f"the save of {handle.path} was not durable after {timeout:g} s")

    def take_failures(self) -> list[SaveHandle]:
        """The saves that failed since the last call and whose error nobody retrieved with
        ``result()``; they count as retrieved from now on."""
        with self._lock:
            failed, self._failed = self._failed, []
        unseen = [h for h in failed if not h.retrieved]
        for h in unseen:
            h.retrieved = True
        return unseen

    @property
    def staged_bytes(self) -> int:
        """Bytes of CPU memory the staging areas hold (the extra memory async saves use)."""
        with self._lock:
            return sum(a.nbytes for a in self._areas)

    # --- the areas -------------------------------------------------------------------------

    def _acquire(self) -> _StagingArea:
        with self._lock:
            while not self._free and len(self._areas) >= self.max_in_flight:
                self._lock.wait()
            if self._free:
                return self._free.pop()
            area = _StagingArea()
            self._areas.append(area)
            return area

    def _release(self, area: _StagingArea) -> None:
        with self._lock:
            self._free.append(area)
            self._lock.notify_all()

    # --- the persist's thread --------------------------------------------------------------

    def _persist(
        self,
        writer: EventWriter | None,
        handle: SaveHandle,
        area: _StagingArea,
        staged: Any,
        previous: threading.Thread | None,
        began: float,
        epoch: int | None,
        on_saved: Callable[[CheckpointSaved], None] | None,
    ) -> None:
        saved: CheckpointSaved | None = None
        error: BaseException | None = None
        _yield_cpu()
        try:
            if previous is not None:
                previous.join()  # in submission order: a later save of a path wins

            def write() -> tuple[int, str]:
                result = atomic_write(handle.path, torch_writer(staged), direct=self.direct_io)
                return result.size_bytes, result.checksum

            saved = record_save(
                writer,
                handle.path,
                trigger=handle.trigger,
                step=handle.step,
                epoch=epoch,
                write=write,
                announce=False,
                began=began,
                blocking_s=handle.blocking_s,
                monitored=handle.monitored,
                artifact=handle.artifact,
            )
        except BaseException as exc:  # handed to the caller through the handle
            error = exc
        finally:
            with self._lock:  # the outcome is known before the area is free for the next save
                self._handles.remove(handle)
                if error is not None:
                    self._failed.append(handle)
            self._release(area)
            handle._finish(saved, error)
        if saved is not None and on_saved is not None:
            try:
                on_saved(saved)
            except Exception as exc:  # the save is durable: a broken hook must not undo that
                warnings.warn(
                    f"ckptdash: on_checkpoint_saved raised for {handle.path}: {exc!r}",
                    RuntimeWarning,
                    stacklevel=1,
                )


def _yield_cpu() -> None:
    """Give this thread (and the hash helper it starts) a lower CPU priority than training.

    On Linux ``nice`` is per thread: a persist competing with the training threads for
    the same cores then takes the time they leave, rather than slowing their steps.
    Elsewhere, or where it is not allowed, the persist runs at normal priority.
    """
    get_native_id = getattr(threading, "get_native_id", None)
    if sys.platform != "linux" or get_native_id is None:
        return
    try:
        tid = get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), _NICE))
    except OSError:
        pass


_SAVERS: weakref.WeakSet[AsyncSaver] = weakref.WeakSet()


@atexit.register
def _wait_at_exit() -> None:
    # Persist threads are daemons (a hung filesystem must not hang the interpreter forever
    # after an error), so a save still in flight when the program ends normally, e.g. a
    # trainer.save_checkpoint() after fit(), would be cut off: wait for it here.
    for saver in list(_SAVERS):
        saver.wait()


def _record_failure(writer: EventWriter, handle: SaveHandle, exc: BaseException) -> None:
    try:
        writer.emit(
            CheckpointFailed,
            step=handle.step,
            path=handle.path,
            trigger=handle.trigger,
            error=f"{type(exc).__name__}: {exc}"[:2000],
        )
    except Exception as log_exc:  # the same full disk: keep the staging error
        warnings.warn(
            f"ckptdash: the failed save of {handle.path} could not be recorded: {log_exc}",
            RuntimeWarning,
            stacklevel=3,
        )
