"""MPI's ``Request``: an operation in progress (what a received message was is its :class:`~.status.Status`).

A ``Request`` wraps the work of a point-to-point operation or of a collective (:mod:`.p2p`,
:mod:`.collectives`). Once completed (``Wait``, a successful ``Test``, ``Waitall``...), it is
``REQUEST_NULL``, as in MPI: false, equal to ``MPI.REQUEST_NULL``, and waiting on it again returns
at once with an empty status. ``MPI.Request()`` is such an inactive request. A persistent request
(``Prequest``, from ``Send_init``/``Recv_init``) starts its operation anew at each ``Start``.

Every test (``Test``, ``Testany``, ``Get_status``...) of a point-to-point request moves the messages
itself, as MPI's do (:meth:`~allreduce.p2p.P2PWork.is_completed`), so a loop of them never waits for
another thread; ``Waitany`` and ``Waitsome`` wait in the engine's poll (:func:`~allreduce.p2p.wait_any`)
and end at the group's timeout like ``Wait``.
"""

from __future__ import annotations

from ..p2p import wait_any
from .errorcodes import ERR_REQUEST, error
from .handles import Handle, constant
from .status import UNDEFINED, Status


class Request(Handle):
    """A nonblocking operation; ``Wait``/``Test`` it, or ``wait``/``test`` for a received object.

    ``work`` is the engine's :class:`~allreduce.p2p.P2PWork` or a collective's ``Work`` (``None``:
    done already, as with ``PROC_NULL``); ``finish()`` runs once, when it is done, and returns the
    operation's value (``None`` for sends and buffer receives).
    """

    def __init__(self, work=None, finish=None, envelope: tuple[int, int, int] | None = None,
                 active: bool | None = None):
        if isinstance(work, Request):  # Request(request): another handle of the same operation
            self.__dict__ = work.__dict__
            return
        if isinstance(work, (Handle, Status, int, float, str)):
            raise TypeError(f"{type(self).__name__}() takes a Request, got {type(work).__name__}")
        self._work, self._finish = work, finish
        self._active = (work is not None or finish is not None or envelope is not None) if active is None else active
        self._value = None
        self._envelope = envelope  # (source, tag, nbytes) of a received message, once known

    def __reduce__(self):
        if self is REQUEST_NULL:
            return _request_null, ()
        if self.null():
            return type(self), ()
        raise ValueError("cannot pickle a request in progress: it completes only where it was started")

    def null(self) -> bool:
        """Whether this is ``REQUEST_NULL``: a completed (or freed) request."""
        return not self._active

    def __bool__(self) -> bool:
        return not self.null()

    def __eq__(self, other) -> bool:
        if isinstance(other, Request):
            return self.__dict__ is other.__dict__ or (self.null() and other.null())
        return NotImplemented

    def _shared(self):
        return None if self.null() else self.__dict__

    def _release(self) -> None:
        self.__dict__ = type(self)().__dict__

    def _ready(self) -> bool:
        """Whether completing it would not wait (a point-to-point one moves the messages first)."""
        return not self._active or self._work is None or self._work.is_completed()

    def _running(self) -> list:
        """The works it still waits for."""
        return [] if self._ready() else [self._work]

    def _complete(self, block: bool, status: Status | None, blocking: bool = False) -> bool:
        """Complete the operation if ``block`` or it is done; ``False`` if not yet."""
        if not self._active:
            if status is not None:
                status.empty()
            return True
        work = self._work
        if work is not None:
            if not block and not work.is_completed():
                return False
            if blocking and hasattr(work, "complete"):
                work.complete()
            else:
                work.wait()  # raises the operation's error
            if getattr(work, "source", None) is not None:
                self._envelope = (work.source, work.tag, work.nbytes)
        self._active = False
        self._value = self._finish() if self._finish else None
        self._work = None
        if status is not None:
            status.fill(*self._envelope) if self._envelope is not None else status.empty()
        return True

    def then(self, callback) -> Request:
        """Run ``callback()`` once the operation completes (now, if it has), after what completing it
        already does; returns this request."""
        if not self._active:
            callback()
            return self
        before = self._finish

        def finish():
            value = before() if before else None
            callback()
            return value
        self._finish = finish
        return self

    def Wait(self, status: Status | None = None) -> bool:
        self._complete(True, status)
        return True

    def finish(self, status: Status | None = None):
        """Wait as a blocking call (``Send``, ``Recv``) does, and return the value: an exception escaping
        the wait cancels the operation or breaks the group (:meth:`~allreduce.p2p.P2PWork.complete`)."""
        self._complete(True, status, blocking=True)
        return self._value

    def interrupted(self, exc: BaseException) -> None:
        """The blocking call this request is part of was cut short by ``exc`` (see :meth:`finish`)."""
        if self._work is not None and self._active:
            self._work.interrupted(exc)

    def Test(self, status: Status | None = None) -> bool:
        return self._complete(False, status)

    def wait(self, status: Status | None = None):
        self._complete(True, status)
        value, self._value = self._value, None
        return value

    def test(self, status: Status | None = None):
        if not self._complete(False, status):
            return False, None
        value, self._value = self._value, None
        return True, value

    def Get_status(self, status: Status | None = None) -> bool:
        """Whether the operation is done, without completing it (its status once done)."""
        if not self._ready():
            return False
        if status is not None:
            if self._active and self._envelope is None and getattr(self._work, "source", None) is not None:
                self._envelope = (self._work.source, self._work.tag, self._work.nbytes)
            status.fill(*self._envelope) if self._envelope is not None else status.empty()
        return True

    get_status = Get_status

    def Cancel(self) -> None:
        """Ask to cancel: operations here cannot be withdrawn once posted, so they complete as usual.

        Raises:
            MPI.Exception: ``ERR_REQUEST`` for ``REQUEST_NULL``.
        """
        self._live("Cancel")

    cancel = Cancel

    def Free(self) -> None:
        """Forget the request (its operation still completes); it becomes ``REQUEST_NULL``."""
        self._live("Free")
        self._active, self._work, self._finish = False, None, None

    def _live(self, what: str) -> None:
        if not self._active:
            raise error(ERR_REQUEST, f"Request.{what} of MPI.REQUEST_NULL")

    # ---- arrays of requests --------------------------------------------------------------------

    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        slots = _statuses(statuses, len(requests))
        for request, status in zip(requests, slots):
            request.Wait(status)
        return True

    @staticmethod
    def waitall(requests, statuses=None) -> list:
        slots = _statuses(statuses, len(requests))
        return [r.wait(s) for r, s in zip(requests, slots)]

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        slots = _statuses(statuses, len(requests))
        if not all([r._ready() for r in requests]):  # every one looked at: each test moves its messages
            return False
        for request, status in zip(requests, slots):
            request.Wait(status)
        return True

    @staticmethod
    def testall(requests, statuses=None):
        slots = _statuses(statuses, len(requests))
        if not Request.Testall(requests):
            return False, None
        return True, [r.wait(s) for r, s in zip(requests, slots)]

    @staticmethod
    def Get_status_all(requests, statuses=None) -> bool:
        slots = _statuses(statuses, len(requests))
        return all([r.Get_status(s) for r, s in zip(requests, slots)])

    get_status_all = Get_status_all

    @staticmethod
    def Waitany(requests, status: Status | None = None) -> int:
        """The index of a request that completed (``UNDEFINED`` if none is active)."""
        return _any(requests, status, block=True)[0]

    @staticmethod
    def waitany(requests, status: Status | None = None):
        index = _any(requests, status, block=True)[0]
        return index, (requests[index].wait() if index != UNDEFINED else None)

    @staticmethod
    def Testany(requests, status: Status | None = None) -> tuple[int, bool]:
        return _any(requests, status, block=False)

    @staticmethod
    def testany(requests, status: Status | None = None):
        index, flag = _any(requests, status, block=False)
        return index, flag, (requests[index].wait() if flag and index != UNDEFINED else None)

    @staticmethod
    def Get_status_any(requests, status: Status | None = None) -> tuple[int, bool]:
        """``Testany`` that leaves the request it finds done as it is."""
        return _any(requests, status, block=False, settled=Request.Get_status)

    get_status_any = Get_status_any

    @staticmethod
    def Waitsome(requests, statuses=None) -> list[int] | None:
        """Indices of the requests that completed, once at least one has (``None``: none is active)."""
        if not any(r._active for r in requests):
            return None
        while True:
            done = Request.Testsome(requests, statuses)
            if done:
                return done
            wait_any(_running(requests))

    @staticmethod
    def waitsome(requests, statuses=None):
        done = Request.Waitsome(requests, statuses)
        return done, (None if done is None else [requests[i].wait() for i in done])

    @staticmethod
    def Testsome(requests, statuses=None) -> list[int] | None:
        if not any(r._active for r in requests):
            return None
        done = [i for i, r in enumerate(requests) if r._active and r._ready()]
        filled = []
        for i in done:
            filled.append(Status() if statuses is not None else None)
            requests[i].Wait(filled[-1])
        if done and isinstance(statuses, list):  # as mpi4py: one status per completed request, in order
            statuses[:] = filled
        return done

    @staticmethod
    def testsome(requests, statuses=None):
        done = Request.Testsome(requests, statuses)
        return done, (None if done is None else [requests[i].wait() for i in done])

    @staticmethod
    def Get_status_some(requests, statuses=None) -> list[int] | None:
        """``Testsome`` that leaves the requests it finds done as they are."""
        if not any(r._active for r in requests):
            return None
        done = [i for i, r in enumerate(requests) if r._active and Request.Get_status(r)]
        if done and isinstance(statuses, list):
            statuses[:] = [Status() for _ in done]
            for i, status in zip(done, statuses):
                requests[i].Get_status(status)
        return done

    get_status_some = Get_status_some

    @staticmethod
    def Cancelall(requests) -> None:
        for request in requests:
            request.Cancel()


def _statuses(statuses, count: int) -> list:
    """One status (or ``None``) per request; a list the caller passed is filled out to ``count``."""
    if statuses is None:
        return [None] * count
    if isinstance(statuses, list):
        statuses.extend(Status() for _ in range(count - len(statuses)))
    return list(statuses) + [None] * (count - len(statuses))


def _running(requests) -> list:
    """The works the active ones of ``requests`` still wait for."""
    return [work for request in requests if request._active for work in request._running()]


def _any(requests, status, block: bool, settled=Request.Test) -> tuple[int, bool]:
    """``(index, flag)`` of one request that ``settled(request, status)`` finds done (``Test``
    completes it); ``(UNDEFINED, True)`` when none is active."""
    while True:
        active = [i for i, r in enumerate(requests) if r._active]
        if not active:
            if status is not None:
                status.empty()
            return UNDEFINED, True
        for i in active:
            if settled(requests[i], status):
                return i, True
        if not block:
            return UNDEFINED, False
        wait_any(_running(requests))


class Prequest(Request):
    """A persistent request: ``Start`` begins its operation again, ``Wait`` completes that round."""

    def __init__(self, start=None):
        if isinstance(start, Prequest):  # Prequest(request): another handle of it
            self.__dict__ = start.__dict__
            return
        if isinstance(start, (Handle, Status, int, float, str)):
            if not (isinstance(start, Request) and start.null()):
                raise TypeError(f"Prequest() takes a Prequest, got {type(start).__name__}")
            start = None  # Prequest(REQUEST_NULL): a null one
        super().__init__(active=False)
        self._start = start  # () -> Request of one round; None once freed

    def null(self) -> bool:
        """A persistent request stays a request between rounds, until freed."""
        return self._start is None

    def Free(self) -> None:
        if self._start is None:
            super().Free()
        self._active, self._work, self._finish, self._start = False, None, None, None

    def Start(self) -> None:
        if self._start is None:
            raise error(ERR_REQUEST, "Prequest.Start of a freed request")
        started = self._start()
        self._work, self._finish, self._envelope, self._active = started._work, started._finish, started._envelope, True

    @staticmethod
    def Startall(requests) -> None:
        for request in requests:
            request.Start()


class Grequest(Request):
    """A generalized request: ``Grequest()`` and ``Grequest(MPI.REQUEST_NULL)`` are null handles;
    starting one (``Grequest.Start``) is not supported and raises ``NotImplementedError``."""

    def __init__(self, request: Request | None = None):
        if request is not None and not (isinstance(request, Request) and request.null()):
            raise TypeError(f"Grequest() takes a null Request, got {type(request).__name__}")
        super().__init__(active=False)

    @classmethod
    def Start(cls, query_fn, free_fn, cancel_fn, args=None, kwargs=None) -> Grequest:
        raise NotImplementedError("generalized requests (MPI.Grequest.Start) are not supported by allreduce.MPI")

    def Complete(self) -> None:
        raise NotImplementedError("generalized requests (MPI.Grequest.Complete) are not supported by allreduce.MPI")


REQUEST_NULL = constant(Request())


def _request_null() -> Request:
    return REQUEST_NULL
