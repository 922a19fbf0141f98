"""torch's ``Work`` for collectives of the allreduce backend, and errors in the words torch's callers match.

A :class:`TorchWork` completes once its allreduce :class:`~allreduce.Work` parts are done and the
``after`` steps (copy-backs of staged tensors) have run, on the group's progress thread. Its
``wait()`` raises the collective's own error, and its ``get_future()`` is completed with the output
tensors or failed, which is what DDP's reducer and communication hooks consume from C++. (torch's
``_create_work_from_future`` is not enough: its ``wait()`` returns normally even when the future
failed, so synchronous ``dist.*`` calls would never see an error.)

A blocking call (torch says its caller waits) runs in the caller's thread and returns a :class:`DoneWork`,
finished from the start: torch requires a work, and this one allocates nothing else.

Timeouts keep the core's message (rank, collective, sequence number, peer) with torch's capital
``Timed out``, which torch's own callers and tests match (Gloo says "Timed out waiting 1000ms ...").
"""

from __future__ import annotations

import datetime
import functools
import re
import threading
import time

import torch
import torch.distributed as dist

from ...errors import CommTimeout


class TorchWork(dist.Work):
    """Done when every work of ``parts`` is, then ``after`` has run; its value is ``result``.

    ``source`` is the rank a receive got its data from (torch's ``Work.source_rank()``); ``None`` for a
    receive from any source, whose one part reports the sender once done. A work made
    of others' ``parts`` completes after them: a future runs its callbacks in the order they were added.
    """

    def __init__(self, parts: list, result, *after, source: int | None = -1):
        super().__init__()
        self.parts = parts
        self._result = result
        self._source = source
        self._error: BaseException | None = None
        self._done = threading.Event()
        settled = torch.futures.Future()  # its value: the outputs, or the error, as an object
        self._future = settled.then(_unwrap)  # an error there fails this one in C++ too
        pending = [len(parts)]
        lock = threading.Lock()

        def finish(done):
            with lock:
                if done.exception() is not None and self._error is None:
                    self._error = torch_error(done.exception())
                pending[0] -= 1
                if pending[0]:
                    return
            try:
                if self._error is None:
                    for step in after:
                        step()
            except BaseException as exc:  # delivered to whoever waits on the work
                self._error = exc
            self._done.set()
            settled.set_result(self._error if self._error is not None else result)

        if not parts:
            pending[0] = 1
            finish(_DONE)
        for part in parts:
            part.get_future().add_done_callback(finish)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until done (at most ``timeout``, zero meaning no limit); raise the collective's error."""
        due = time.monotonic() + timeout.total_seconds() if timeout else None
        try:
            for part in self.parts:
                part.wait(None if due is None else max(0.0, due - time.monotonic()))
        except TimeoutError as exc:
            if not part.get_future().done():  # this wait's limit, not the collective's own timeout
                raise torch_error(exc) from None
        except Exception:
            pass  # the part's own error, which finish() recorded in torch's words
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def source_rank(self) -> int:
        if self._source is None:
            sender = self.parts[0].source
            return -1 if sender is None else sender
        return self._source

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> list:
        self.wait()
        return self._result


class DoneWork(dist.Work):
    """The work of a collective that already ran in the caller's thread (a blocking call, see
    :mod:`.backend`): nothing to wait for; a future is made only if someone asks for one."""

    parts = ()  # no allreduce works left to wait for (see TorchWork.parts)

    def __init__(self, result):
        super().__init__()
        self.outputs = result

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def source_rank(self) -> int:
        return -1

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self.outputs)
        return future

    def result(self) -> list:
        return self.outputs


def in_torch_words(method):
    """``method`` raising its timeouts as :func:`torch_error` words them: a blocking call runs in the
    caller's thread, so its errors reach torch directly rather than through a work."""

    @functools.wraps(method)
    def worded(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except TimeoutError as exc:
            reworded = torch_error(exc)
            if reworded is exc:
                raise
            raise reworded from exc

    return worded


def torch_error(exc: BaseException) -> BaseException:
    """``exc`` as torch's callers expect it: a timeout says ``Timed out`` (a :class:`CommTimeout`)."""
    if not isinstance(exc, TimeoutError) or "Timed out" in str(exc):
        return exc
    message = str(exc)
    for pattern, words in ((r"\btimed out\b", "Timed out"), (r"\bdid not complete within\b", "Timed out after")):
        if re.search(pattern, message):
            reworded = CommTimeout(re.sub(pattern, words, message, count=1))
            break
    else:
        reworded = CommTimeout(f"Timed out: {message}")
    reworded.__cause__ = exc
    return reworded


class _Done:
    """A finished future standing in for no parts at all."""

    @staticmethod
    def exception():
        return None


_DONE = _Done()


def _unwrap(settled: torch.futures.Future):
    value = settled.value()
    if isinstance(value, BaseException):
        raise value
    return value
