"""hsdp's errors as Python exceptions: one class per hsdp StatusCode, all under hsdp.Error.

The text is hsdp's own message (it names the value, file or rank at fault). Each class also
derives from the built-in exception a Python caller would catch for it: a bad argument is a
ValueError, a name that does not exist a KeyError, an allocation that does not fit a MemoryError.
"""


class Error(RuntimeError):
    """Any error hsdp reports."""


class InvalidArgumentError(Error, ValueError):
    """A value that can never work: a bad factor, a missing or corrupt file, a wrong dtype."""


class NotFoundError(Error, KeyError):
    """A named thing (a tensor, a parameter, a checkpoint) does not exist."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class FailedPreconditionError(Error):
    """The call is valid, but not in the object's current state (e.g. MPI not initialised)."""


class OutOfRangeError(Error, ValueError):
    """A size or index beyond what the implementation supports."""


class UnimplementedError(Error, NotImplementedError):
    """A valid request this build or backend does not support."""


class InternalError(Error):
    """The machine failed: an I/O error, a full disk, a foreign library (MPI, NCCL)."""


class ResourceExhaustedError(Error, MemoryError):
    """An allocation did not fit."""


class AbortedError(Error):
    """The operation was abandoned with nothing changed; it can be repeated."""


__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "FailedPreconditionError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "ResourceExhaustedError",
    "AbortedError",
]
