"""The point-to-point methods of a communicator, on buffers and on objects, and matched probes.

``Bsend`` and ``Rsend`` are standard sends (:mod:`.p2p`), which every correct MPI program allows (a
small message is on its way once handed to the kernel, a large one once its receive is posted);
``Ssend``/``Issend`` are synchronous: done only once a receive took the message. Persistent requests
(``Send_init``, ``Recv_init``) post a new operation at each ``Start``. ``Mprobe``/``Improbe`` return a ``Message``
whose ``Recv`` takes the probed message: the first message of that source and tag, which is the
probed one while no other receive of the same source and tag is posted meanwhile.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np

from .. import objects
from . import p2p
from .bufferargs import simple, written
from .handles import Handle, constant
from .requests import Prequest, Request
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL, Status


class PointToPoint:
    """Point-to-point methods of :class:`~allreduce.mpi.comm.Comm`, which provides ``process_group()``."""

    def _p2p(self):
        group = self.process_group()
        return group.p2p, group.size

    # ---- buffers ---------------------------------------------------------------------------------

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Send the buffer; returns once it is on its way (a large one: once its receive is posted)."""
        self.Isend(buf, dest, tag).finish()

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start sending the buffer, which must not change until the request is done."""
        return p2p.send(*self._p2p(), simple(buf, "buf", False), dest, tag)

    Bsend = Rsend = Send
    Ibsend = Irsend = Isend

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        """Send the buffer; returns once a receive on ``dest`` took it (synchronous mode)."""
        self.Issend(buf, dest, tag).finish()

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send: the request completes once a receive on ``dest`` took the message."""
        return p2p.send(*self._p2p(), simple(buf, "buf", False), dest, tag, synchronous=True)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        self.Irecv(buf, source, tag).finish(status)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving a message that fits the buffer (a larger one raises ``Mismatch``)."""
        target = simple(buf, "buf", True)
        return p2p.receive(*self._p2p(), target, source, tag, _into(target))

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send and receive at once: the receive is posted first, so a ring of them never deadlocks.
        Both buffers are checked before either is posted, so a bad one leaves nothing pending."""
        outgoing, target = simple(sendbuf, "sendbuf", False), simple(recvbuf, "recvbuf", True)
        receiving = p2p.receive(*self._p2p(), target, source, recvtag, _into(target))
        p2p.exchange(receiving, _sent(self, receiving, outgoing, dest, sendtag), status)

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                         status: Status | None = None) -> None:
        """Send the buffer and receive into it: the outgoing bytes are copied first."""
        target = simple(buf, "buf", True)
        outgoing = target.copy()
        receiving = p2p.receive(*self._p2p(), target, source, recvtag, _into(target))
        p2p.exchange(receiving, _sent(self, receiving, outgoing, dest, sendtag), status)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        """``Sendrecv_replace`` started: the outgoing bytes are copied first."""
        target = simple(buf, "buf", True)
        outgoing = target.copy()  # before the receive may write into it
        receiving = p2p.receive(*self._p2p(), target, source, recvtag, _into(target))
        return _Both(receiving, _sent(self, receiving, outgoing, dest, sendtag))

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                  recvtag: int = ANY_TAG) -> Request:
        """``Sendrecv`` started: the request completes when both halves have."""
        outgoing, target = simple(sendbuf, "sendbuf", False), simple(recvbuf, "recvbuf", True)
        receiving = p2p.receive(*self._p2p(), target, source, recvtag, _into(target))
        return _Both(receiving, _sent(self, receiving, outgoing, dest, sendtag))

    def Send_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each ``Start`` sends the buffer's contents at that time."""
        return Prequest(lambda: self.Isend(buf, dest, tag))

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent synchronous send: each round completes once a receive took it."""
        return Prequest(lambda: self.Issend(buf, dest, tag))

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        return Prequest(lambda: self.Irecv(buf, source, tag))

    # ---- objects ---------------------------------------------------------------------------------

    def send(self, obj, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).finish()

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        return self._object_send(obj, dest, tag, "send/isend", synchronous=False)

    bsend = send
    ibsend = isend

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        self.issend(obj, dest, tag).finish()

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        """``isend`` in synchronous mode: the request completes once a receive took the object."""
        return self._object_send(obj, dest, tag, "ssend/issend", synchronous=True)

    def _object_send(self, obj, dest: int, tag: int, what: str, synchronous: bool) -> Request:
        objects.check_trusted(self.process_group(), f"{what} of an object")
        payload = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
        return p2p.send(*self._p2p(), payload, dest, tag, synchronous=synchronous)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None):
        """The next object from ``source`` with ``tag`` (either may be ANY_*). ``buf`` is ignored, with a
        ``UserWarning``: the object is received into memory of its message's size."""
        if buf is not None:
            warnings.warn("recv() ignores its buf argument: the object is received into memory of the "
                          "message's size", UserWarning, stacklevel=2)
        return self.irecv(None, source, tag).finish(status)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        objects.check_trusted(self.process_group(), "recv/irecv of an object")
        return p2p.receive(*self._p2p(), None, source, tag, _unpickled)

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None):
        payload = np.frombuffer(pickle.dumps(sendobj, pickle.HIGHEST_PROTOCOL), np.uint8)
        receiving = self.irecv(recvbuf, source, recvtag)
        return p2p.exchange(receiving, _sent(self, receiving, payload, dest, sendtag), status)

    # ---- probes ----------------------------------------------------------------------------------

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Wait until a message from ``source`` with ``tag`` can be received; describe it in ``status``."""
        found = p2p.probe(*self._p2p(), source, tag, block=True)
        if status is not None:
            status.fill(*found)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        found = p2p.probe(*self._p2p(), source, tag, block=False)
        if found is not None and status is not None:
            status.fill(*found)
        return found is not None

    probe, iprobe = Probe, Iprobe

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Message:
        """Wait for a message as ``Probe`` does, and return it as a ``Message`` to receive."""
        found = p2p.probe(*self._p2p(), source, tag, block=True)
        if status is not None:
            status.fill(*found)
        return Message.of(self, found)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Message | None:
        found = p2p.probe(*self._p2p(), source, tag, block=False)
        if found is None:
            return None
        if status is not None:
            status.fill(*found)
        return Message.of(self, found)

    mprobe = Mprobe
    improbe = Improbe


def _sent(comm, receiving: Request, payload: np.ndarray, dest: int, tag: int) -> Request:
    """The send half of a send-receive whose receive is posted: if the send cannot start (a bad
    ``dest`` or tag), the receive is withdrawn too, so no later message is taken by it."""
    try:
        return p2p.send(*comm._p2p(), payload, dest, tag)
    except BaseException as exc:
        receiving.interrupted(exc)
        raise


class _Both(Request):
    """The request of a started send-receive: done when its receive and its send are."""

    def __init__(self, receiving: Request, sending: Request):
        super().__init__(active=True)
        self._parts = receiving, sending

    def _ready(self) -> bool:
        return not self._active or all([part._ready() for part in self._parts])

    def _running(self) -> list:
        return [work for part in self._parts for work in part._running()]

    def _complete(self, block: bool, status: Status | None, blocking: bool = False) -> bool:
        receiving, sending = self._parts
        if not block and not self._ready():
            return False
        receiving._complete(True, status, blocking)
        sending._complete(True, None, blocking)
        self._active = False
        return True


class Message(Handle):
    """A probed message (``Mprobe``/``Improbe``), received once by ``Recv``/``Irecv``/``recv``/``irecv``.
    ``Message()`` is ``MESSAGE_NULL``; a probe of ``PROC_NULL`` gives ``MESSAGE_NO_PROC``."""

    def __init__(self, message: Message | None = None):
        if isinstance(message, Message):
            self._comm, self._envelope, self._no_proc = message._comm, message._envelope, message._no_proc
        elif message is None:
            self._comm, self._envelope, self._no_proc = None, None, False
        else:
            raise TypeError(f"Message() takes a Message, got {type(message).__name__}")

    @classmethod
    def of(cls, comm, envelope: tuple[int, int, int]) -> Message:
        if envelope[0] == PROC_NULL:
            return cls(MESSAGE_NO_PROC)  # a handle of its own: receiving it makes it MESSAGE_NULL
        made = cls()
        made._comm, made._envelope = comm, envelope
        return made

    def __bool__(self) -> bool:
        return self._envelope is not None or self._no_proc

    def __reduce__(self):
        for predefined in (MESSAGE_NULL, MESSAGE_NO_PROC):
            if self is predefined:
                return _predefined, (predefined._no_proc,)
        if self._envelope is None:
            return type(self), (MESSAGE_NO_PROC if self._no_proc else MESSAGE_NULL,)
        raise ValueError("cannot pickle a probed message: it can only be received where it was probed")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self._envelope is not None or other._envelope is not None:
            return self._envelope is other._envelope  # handles of one probed message, as Message(message) makes
        return self._no_proc == other._no_proc

    def _shared(self):
        return self._envelope if self._envelope is not None else (MESSAGE_NO_PROC if self._no_proc else None)

    def _is_predefined(self) -> bool:
        return self._envelope is None

    def _release(self) -> None:
        self._comm, self._envelope, self._no_proc = None, None, False

    def _take(self):
        """``(comm, source, tag)`` of the message, which is then consumed."""
        if self._no_proc:
            if self is not MESSAGE_NO_PROC:  # a copy is consumed, the constant stays
                self._no_proc = False
            return None, PROC_NULL, ANY_TAG
        if self._envelope is None:
            raise ValueError("MPI.MESSAGE_NULL holds no message to receive")
        comm, (source, tag, _), self._envelope = self._comm, self._envelope, None
        return comm, source, tag

    def Free(self) -> None:
        """A probed message is not freed but received: this handle just becomes ``MESSAGE_NULL``."""
        self._release()

    def Recv(self, buf, status: Status | None = None) -> None:
        self.Irecv(buf).finish(status)

    def Irecv(self, buf) -> Request:
        comm, source, tag = self._take()
        if comm is None:
            return Request(None, None, (PROC_NULL, ANY_TAG, 0))
        return comm.Irecv(buf, source, tag)

    def recv(self, status: Status | None = None):
        return self.irecv().finish(status)

    def irecv(self) -> Request:
        comm, source, tag = self._take()
        if comm is None:
            return Request(None, lambda: None, (PROC_NULL, ANY_TAG, 0))
        return comm.irecv(None, source, tag)

    @classmethod
    def probe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Message:
        return comm.Mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None):
        return comm.Improbe(source, tag, status)

    Probe, Iprobe = probe, iprobe


MESSAGE_NULL = constant(Message())
MESSAGE_NO_PROC = constant(Message())
MESSAGE_NO_PROC._no_proc = True


def _predefined(no_proc: bool) -> Message:
    return MESSAGE_NO_PROC if no_proc else MESSAGE_NULL


def _into(target: np.ndarray):
    """A buffer receive's ``deliver``: the bytes are in ``target``, written back to the user's memory
    if a derived datatype packed it (:func:`~.bufferargs.written`)."""
    return lambda payload: written(target)



def _unpickled(payload):
    """The object a message's bytes pickle; an empty message (none from ``PROC_NULL``, or a buffer
    send of no bytes) is ``None``."""
    return None if payload is None or not len(payload) else pickle.loads(payload)
