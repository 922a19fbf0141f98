"""The key-value store protocol as pure functions: messages in, bytes out, and back.

No sockets here (h11's idea): :func:`encode` turns a message into one frame, and a
:class:`RequestDecoder` or :class:`ResponseDecoder` is fed whatever bytes arrived, in pieces of any
size, and hands back the complete messages so far. The TCP store speaks it over a socket and the
file store appends request frames to a shared file as its log, so both are tested and fuzzed here
without either.

A frame is a 10-byte header, ``magic (4s) | version (u8) | code (u8) | body length (u32)``, network
byte order, then the body. In a body a key is ``length (u16) | UTF-8``, a key list is ``count (u32)``
then its keys, and a value (Set, Value) or a message (Failed) is the rest of the body. The decoder
checks magic, version, code and the length limits as soon as the header is in, so a hostile or
foreign peer is refused before its body is buffered; anything malformed is a :class:`ProtocolError`,
and a decoder that raised once stays failed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ProtocolError

MAGIC = b"ARkv"
VERSION = 1
MAX_KEY = 4096  # bytes of UTF-8 in one key
MAX_VALUE = 64 << 20  # bytes in one value
MAX_TIMEOUT_MS = 2**32 - 1  # about 49 days: longer waits are clamped to this
MAX_BODY = MAX_VALUE + MAX_KEY + 16  # the largest body, a Set of the largest key and value

_HEADER = struct.Struct("!4sBBI")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def check_key(key: str) -> bytes:
    """The UTF-8 bytes of ``key``, or ``ValueError`` if it is not a non-empty str of at most MAX_KEY bytes."""
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, not {type(key).__name__}")
    raw = key.encode("utf-8")
    if not 0 < len(raw) <= MAX_KEY:
        raise ValueError(f"store key must be 1 to {MAX_KEY} bytes of UTF-8, got {len(raw)}")
    return raw


class _Reader:
    """Reads fields off one frame body; any shortfall or leftover is a ProtocolError."""

    def __init__(self, body: bytes, name: str):
        self._body = body
        self._pos = 0
        self._name = name

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if end > len(self._body):
            raise ProtocolError(f"{self._name} frame body is truncated")
        chunk = self._body[self._pos:end]
        self._pos = end
        return chunk

    def number(self, fmt: struct.Struct) -> int:
        return fmt.unpack(self.take(fmt.size))[0]

    def key(self) -> str:
        size = self.number(_U16)
        if not 0 < size <= MAX_KEY:
            raise ProtocolError(f"{self._name} frame has a key of {size} bytes (1 to {MAX_KEY} allowed)")
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{self._name} frame has a key that is not UTF-8") from exc

    def keys(self) -> tuple[str, ...]:
        return tuple(self.key() for _ in range(self.number(_U32)))

    def rest(self) -> bytes:
        chunk = self._body[self._pos:]
        self._pos = len(self._body)
        return chunk

    def end(self) -> None:
        if self._pos != len(self._body):
            raise ProtocolError(f"{self._name} frame has {len(self._body) - self._pos} bytes past its fields")


def _key(key: str) -> bytes:
    raw = check_key(key)
    return _U16.pack(len(raw)) + raw


def _keys(keys: tuple[str, ...]) -> bytes:
    return _U32.pack(len(keys)) + b"".join(_key(k) for k in keys)


# Requests (client -> store)


@dataclass(frozen=True, slots=True)
class Set:
    """Store ``value`` under ``key``, replacing any previous value."""

    code: ClassVar[int] = 1
    key: str
    value: bytes

    def body(self) -> bytes:
        return _key(self.key) + self.value

    @classmethod
    def parse(cls, r: _Reader) -> Set:
        return cls(r.key(), r.rest())


@dataclass(frozen=True, slots=True)
class Get:
    """The value of ``key``, waiting up to ``timeout_ms`` for it to be set."""

    code: ClassVar[int] = 2
    key: str
    timeout_ms: int

    def body(self) -> bytes:
        return _key(self.key) + _U32.pack(self.timeout_ms)

    @classmethod
    def parse(cls, r: _Reader) -> Get:
        return cls(r.key(), r.number(_U32))


@dataclass(frozen=True, slots=True)
class Add:
    """Add ``amount`` to the counter at ``key`` (created at 0) and answer the new count."""

    code: ClassVar[int] = 3
    key: str
    amount: int

    def body(self) -> bytes:
        return _key(self.key) + _I64.pack(self.amount)

    @classmethod
    def parse(cls, r: _Reader) -> Add:
        return cls(r.key(), r.number(_I64))


@dataclass(frozen=True, slots=True)
class Wait:
    """Answer Ok once every key is set, or TimedOut after ``timeout_ms``."""

    code: ClassVar[int] = 4
    keys: tuple[str, ...]
    timeout_ms: int

    def body(self) -> bytes:
        return _U32.pack(self.timeout_ms) + _keys(self.keys)

    @classmethod
    def parse(cls, r: _Reader) -> Wait:
        timeout_ms = r.number(_U32)
        return cls(r.keys(), timeout_ms)


@dataclass(frozen=True, slots=True)
class Check:
    """Answer whether every key is set, without waiting."""

    code: ClassVar[int] = 5
    keys: tuple[str, ...]

    def body(self) -> bytes:
        return _keys(self.keys)

    @classmethod
    def parse(cls, r: _Reader) -> Check:
        return cls(r.keys())


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key``; answer whether it was there."""

    code: ClassVar[int] = 6
    key: str

    def body(self) -> bytes:
        return _key(self.key)

    @classmethod
    def parse(cls, r: _Reader) -> Delete:
        return cls(r.key())


# Responses (store -> client), one per request, in request order


@dataclass(frozen=True, slots=True)
class Ok:
    """Done (Set, Wait)."""

    code: ClassVar[int] = 1

    def body(self) -> bytes:
        return b""

    @classmethod
    def parse(cls, r: _Reader) -> Ok:
        return cls()


@dataclass(frozen=True, slots=True)
class Value:
    """The value a Get asked for."""

    code: ClassVar[int] = 2
    value: bytes

    def body(self) -> bytes:
        return self.value

    @classmethod
    def parse(cls, r: _Reader) -> Value:
        return cls(r.rest())


@dataclass(frozen=True, slots=True)
class Count:
    """The counter after an Add."""

    code: ClassVar[int] = 3
    count: int

    def body(self) -> bytes:
        return _I64.pack(self.count)

    @classmethod
    def parse(cls, r: _Reader) -> Count:
        return cls(r.number(_I64))


@dataclass(frozen=True, slots=True)
class Flag:
    """The answer to Check (all set) or Delete (was there)."""

    code: ClassVar[int] = 4
    flag: bool

    def body(self) -> bytes:
        return bytes([self.flag])

    @classmethod
    def parse(cls, r: _Reader) -> Flag:
        raw = r.take(1)[0]
        if raw > 1:
            raise ProtocolError(f"Flag frame holds {raw}, not 0 or 1")
        return cls(bool(raw))


@dataclass(frozen=True, slots=True)
class TimedOut:
    """A Get or Wait passed its deadline; ``missing`` are the keys still unset."""

    code: ClassVar[int] = 5
    missing: tuple[str, ...]

    def body(self) -> bytes:
        return _keys(self.missing)

    @classmethod
    def parse(cls, r: _Reader) -> TimedOut:
        return cls(r.keys())


@dataclass(frozen=True, slots=True)
class Failed:
    """The request was well formed but not allowed (e.g. Add to a key that holds no integer)."""

    code: ClassVar[int] = 6
    message: str

    def body(self) -> bytes:
        return self.message.encode("utf-8")

    @classmethod
    def parse(cls, r: _Reader) -> Failed:
        return cls(r.rest().decode("utf-8", errors="replace"))


Request = Set | Get | Add | Wait | Check | Delete
Response = Ok | Value | Count | Flag | TimedOut | Failed
MUTATIONS = (Set, Add, Delete)  # the requests that change the store (and go to a file store's log)

_REQUESTS = {kind.code: kind for kind in (Set, Get, Add, Wait, Check, Delete)}
_RESPONSES = {kind.code: kind for kind in (Ok, Value, Count, Flag, TimedOut, Failed)}


def encode(message: Request | Response) -> bytes:
    """One frame carrying ``message``.

    Raises:
        ValueError: a key or the whole body is over its limit (nothing is sent).
    """
    body = message.body()
    if len(body) > MAX_BODY:
        raise ValueError(f"{type(message).__name__} body of {len(body)} bytes is over the "
                         f"{MAX_BODY}-byte limit")
    return _HEADER.pack(MAGIC, VERSION, message.code, len(body)) + body


class _Decoder:
    """Collects bytes and cuts them into frames of the kinds in ``_KINDS``."""

    _KINDS: ClassVar[dict[int, type]]
    _DIRECTION: ClassVar[str]

    def __init__(self) -> None:
        self._buf = bytearray()
        self._failed: ProtocolError | None = None

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list:
        """Take ``data`` (any split of the stream) and return the messages it completed, in order.

        Raises:
            ProtocolError: the stream is not a valid sequence of frames (then and on every later feed).
        """
        if self._failed is not None:
            raise ProtocolError(f"{self._DIRECTION} stream already failed: {self._failed}")
        self._buf += data
        try:
            return self._frames()
        except ProtocolError as exc:
            self._failed = exc
            self._buf.clear()
            raise

    def _frames(self) -> list:
        messages = []
        while True:
            if not MAGIC.startswith(bytes(self._buf[: len(MAGIC)])):
                start = bytes(self._buf[: len(MAGIC)])
                raise ProtocolError(f"{self._DIRECTION} frame starts with {start!r}, not {MAGIC!r}")
            if len(self._buf) < _HEADER.size:
                return messages
            _, version, code, size = _HEADER.unpack_from(self._buf)
            if version != VERSION:
                raise ProtocolError(f"{self._DIRECTION} frame has version {version}, expected {VERSION}")
            kind = self._KINDS.get(code)
            if kind is None:
                raise ProtocolError(f"{self._DIRECTION} frame has unknown code {code}")
            if size > MAX_BODY:
                raise ProtocolError(f"{kind.__name__} frame declares {size} bytes, over the "
                                    f"{MAX_BODY}-byte limit")
            end = _HEADER.size + size
            if len(self._buf) < end:
                return messages
            reader = _Reader(bytes(self._buf[_HEADER.size:end]), kind.__name__)
            del self._buf[:end]
            message = kind.parse(reader)
            reader.end()
            messages.append(message)


class RequestDecoder(_Decoder):
    """Decodes what a client sends: :data:`Request` messages."""

    _KINDS = _REQUESTS
    _DIRECTION = "request"


class ResponseDecoder(_Decoder):
    """Decodes what the store answers: :data:`Response` messages."""

    _KINDS = _RESPONSES
    _DIRECTION = "response"
