"""MPI's error classes and ``MPI.Exception``, with mpi4py's numbers (those of Open MPI).

A bad argument to a method raises ``MPI.Exception`` carrying the error class MPI gives it
(``ERR_ARG``, ``ERR_RANK``, ``ERR_TYPE``, ...), so code that inspects ``Get_error_class()`` works
unchanged. ``MPI.Exception`` is a ``RuntimeError``, as in mpi4py; communication failures keep the
library's own errors (``GroupBroken``, ``Mismatch``, ...), which name the peer and the collective.
"""

from __future__ import annotations

import functools

_CLASSES = {  # name: (code, what it means)
    "SUCCESS": (0, "no errors"), "ERR_BUFFER": (1, "invalid buffer pointer"),
    "ERR_COUNT": (2, "invalid count argument"),
    "ERR_TYPE": (3, "invalid datatype"), "ERR_TAG": (4, "invalid tag"), "ERR_COMM": (5, "invalid communicator"),
    "ERR_RANK": (6, "invalid rank"), "ERR_REQUEST": (7, "invalid request"), "ERR_ROOT": (8, "invalid root"),
    "ERR_GROUP": (9, "invalid group"), "ERR_OP": (10, "invalid reduce operation"),
    "ERR_TOPOLOGY": (11, "invalid communicator topology"), "ERR_DIMS": (12, "invalid topology dimension"),
    "ERR_ARG": (13, "invalid argument of some other kind"), "ERR_UNKNOWN": (14, "unknown error"),
    "ERR_TRUNCATE": (15, "message truncated"), "ERR_OTHER": (16, "known error not in list"),
    "ERR_INTERN": (17, "internal error"), "ERR_IN_STATUS": (18, "error code is in status"),
    "ERR_PENDING": (19, "pending request"), "ERR_ACCESS": (20, "invalid access mode"),
    "ERR_AMODE": (21, "invalid amode argument"), "ERR_ASSERT": (22, "invalid assert argument"),
    "ERR_BAD_FILE": (23, "bad file"), "ERR_BASE": (24, "invalid base"),
    "ERR_CONVERSION": (25, "error in data conversion"), "ERR_DISP": (26, "invalid displacement"),
    "ERR_DUP_DATAREP": (27, "data representation already defined"), "ERR_FILE_EXISTS": (28, "file exists"),
    "ERR_FILE_IN_USE": (29, "file in use"), "ERR_FILE": (30, "invalid file"),
    "ERR_INFO_KEY": (31, "invalid info key"), "ERR_INFO_NOKEY": (32, "no such info key"),
    "ERR_INFO_VALUE": (33, "invalid info value"), "ERR_INFO": (34, "invalid info object"),
    "ERR_IO": (35, "input/output error"), "ERR_KEYVAL": (36, "invalid key value"),
    "ERR_LOCKTYPE": (37, "invalid lock"), "ERR_NAME": (38, "name not found"),
    "ERR_NO_MEM": (39, "out of memory"), "ERR_NOT_SAME": (40, "objects not identical"),
    "ERR_NO_SPACE": (41, "no space left on device"), "ERR_NO_SUCH_FILE": (42, "no such file or directory"),
    "ERR_PORT": (43, "invalid port"), "ERR_QUOTA": (44, "out of quota"), "ERR_READ_ONLY": (45, "file is read only"),
    "ERR_RMA_CONFLICT": (46, "rma conflict during operation"), "ERR_RMA_SYNC": (47, "error executing rma sync"),
    "ERR_SERVICE": (48, "unknown service name"), "ERR_SIZE": (49, "invalid size"),
    "ERR_SPAWN": (50, "could not spawn processes"), "ERR_UNSUPPORTED_DATAREP": (51, "requested data representation "
                                                                                    "not supported"),
    "ERR_UNSUPPORTED_OPERATION": (52, "operation not supported"), "ERR_WIN": (53, "invalid window"),
    "ERR_RMA_RANGE": (68, "invalid RMA address range"), "ERR_RMA_ATTACH": (69, "could not attach RMA segment"),
    "ERR_RMA_FLAVOR": (70, "invalid type of window"), "ERR_RMA_SHARED": (71, "memory cannot be shared"),
    "ERR_PROC_ABORTED": (74, "process aborted"), "ERR_PROC_FAILED": (75, "process has failed"),
    "ERR_PROC_FAILED_PENDING": (76, "process has failed, pending request"), "ERR_REVOKED": (77, "communicator revoked"),
    "ERR_SESSION": (78, "invalid session"), "ERR_VALUE_TOO_LARGE": (79, "value is too large to store"),
    "ERR_ERRHANDLER": (92, "invalid error handler"),
}
globals().update({name: code for name, (code, _) in _CLASSES.items()})
SUCCESS, ERR_ARG, ERR_UNKNOWN = (_CLASSES[name][0] for name in ("SUCCESS", "ERR_ARG", "ERR_UNKNOWN"))  # used below
ERR_LASTCODE = 92
ERR_ABI = 92
NAMES = tuple(_CLASSES) + ("ERR_LASTCODE", "ERR_ABI")

_strings = {code: f"MPI_{name}: {text}" for name, (code, text) in _CLASSES.items()}
_user_classes: dict[int, int] = {}  # a code added by Add_error_code (or class by Add_error_class): its class
LASTUSEDCODE = 5  # the MPI attribute key under which Comm.Get_attr answers the last code added


@functools.total_ordering
class Exception(RuntimeError):
    """An MPI error: ``Get_error_code()``, ``Get_error_class()``, ``Get_error_string()`` as in mpi4py;
    it compares, hashes and converts as its code (``MPI.Exception(MPI.ERR_ARG) == MPI.ERR_ARG``)."""

    def __init__(self, ierr: int = SUCCESS, message: str | None = None):
        ierr = int(ierr)
        self.error_code = ierr if ierr >= SUCCESS else ERR_UNKNOWN
        super().__init__(message or _strings.get(self.error_code, f"MPI error code {self.error_code}"))

    def Get_error_code(self) -> int:
        return self.error_code

    def Get_error_class(self) -> int:
        return _user_classes.get(self.error_code, self.error_code if self.error_code <= ERR_LASTCODE else ERR_UNKNOWN)

    def Get_error_string(self) -> str:
        return _strings.get(self.error_code, f"MPI error code {self.error_code}")

    error_class = property(Get_error_class)
    error_string = property(Get_error_string)

    def __repr__(self) -> str:
        return f"MPI.Exception({self.error_code})"

    def __eq__(self, other) -> bool:
        return self.error_code == int(other)

    def __lt__(self, other) -> bool:
        return self.error_code < int(other)

    def __hash__(self) -> int:
        return hash(self.error_code)

    def __int__(self) -> int:
        return self.error_code

    def __bool__(self) -> bool:
        return self.error_code != SUCCESS


def error(code: int, message: str) -> Exception:
    """An ``MPI.Exception`` of error class ``code`` whose text says what was wrong."""
    return Exception(code, f"{_strings.get(code, 'MPI error')}: {message}")


def Get_error_string(errorcode: int) -> str:
    """MPI's text for an error code or class.

    Raises:
        Exception: ``ERR_ARG`` for a code that is not one.
    """
    if errorcode not in _strings:
        raise Exception(ERR_ARG)
    return _strings[errorcode]


def Get_error_class(errorcode: int) -> int:
    """The class of an error code (a class is its own).

    Raises:
        Exception: ``ERR_ARG`` for a code that is not one.
    """
    if errorcode not in _strings:
        raise Exception(ERR_ARG)
    return Exception(errorcode).Get_error_class()


def _new_code(error_class: int) -> int:
    global LASTUSEDCODE_VALUE
    LASTUSEDCODE_VALUE = max(ERR_LASTCODE, LASTUSEDCODE_VALUE) + 1
    _user_classes[LASTUSEDCODE_VALUE] = error_class
    _strings[LASTUSEDCODE_VALUE] = ""
    return LASTUSEDCODE_VALUE


LASTUSEDCODE_VALUE = ERR_LASTCODE  # what Comm.Get_attr(MPI.LASTUSEDCODE) answers


def Add_error_class() -> int:
    """A new error class for this process (its own class)."""
    code = _new_code(0)
    _user_classes[code] = code
    return code


def Add_error_code(errorclass: int) -> int:
    """A new error code of ``errorclass`` (a class of MPI's or one from :func:`Add_error_class`)."""
    if errorclass not in _strings:
        raise Exception(ERR_ARG)
    return _new_code(errorclass)


def Add_error_string(errorcode: int, string: str) -> None:
    """Set the text of a code or class added by this process (MPI's own cannot be changed)."""
    if errorcode not in _user_classes:
        raise Exception(ERR_ARG)
    _strings[errorcode] = str(string)


def _mpi41(name: str):
    def refused(errorcode: int) -> None:
        raise NotImplementedError(f"MPI.{name} is MPI-4.1, which allreduce.MPI (MPI 3.1) does not offer")
    refused.__name__ = name
    refused.__doc__ = "Not supported (MPI-4.1): raises NotImplementedError."
    return refused


Remove_error_class, Remove_error_code, Remove_error_string = (
    _mpi41(name) for name in ("Remove_error_class", "Remove_error_code", "Remove_error_string"))
