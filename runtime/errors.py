"""Typed errors. Each carries the HTTP status and error code it becomes in the error envelope."""

from __future__ import annotations


class RuntimeServiceError(Exception):
    """Base class: every error the runtime raises on purpose."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def envelope(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class PackageError(RuntimeServiceError):
    """A model package failed resolution or verification. Never retried."""

    status = 503
    code = "not_ready"

    def __init__(self, message: str, path: str | None = None):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class DownloadError(PackageError):
    """A package could not be fetched (the Hub did not answer, a transfer broke off): worth retrying, unlike
    a verification failure."""

    transient = True


class LicenceRefused(PackageError):
    """A package whose licence allows only uses the operator has not accepted; `needs`: the SPDX ids to accept."""

    def __init__(self, message: str, path: str, needs: list[str]):
        super().__init__(message, path)
        self.needs = needs


class MemoryBudgetExceeded(RuntimeServiceError):
    """A model whose weights would pass the memory budget left for them. Never retried."""

    status = 503
    code = "not_ready"

    def __init__(self, message: str, needed: int, budget: int):
        super().__init__(message)
        self.needed, self.budget = needed, budget


class UnsupportedDeviceError(RuntimeServiceError):
    status = 503
    code = "not_ready"


class InvalidRequest(RuntimeServiceError):
    status = 400
    code = "invalid_request"


class ModelNotFound(RuntimeServiceError):
    status = 404
    code = "model_not_found"


class RequestTooLarge(RuntimeServiceError):
    status = 413
    code = "request_too_large"


class Overloaded(RuntimeServiceError):
    """`limit`: which of the server's limits refused the request (queue, queued_tokens, inflight_bytes, media_slots)."""

    status = 429
    code = "overloaded"
    retry_after_s: int | None = 1  # the queue drains within a forward or two

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class NotReady(RuntimeServiceError):
    """A model that is not ready; `retry_after_s` when it is on its way (loading, warming), None when it failed."""

    status = 503
    code = "not_ready"

    def __init__(self, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ArtifactError(RuntimeServiceError):
    """An exported artifact is missing, tampered with or does not fit the package."""

    status = 503
    code = "not_ready"


class VerificationError(RuntimeServiceError):
    """A model answered the golden suite unlike its recorded answers, or its golden answers do not belong to it.
    Never retried: the same weights on the same device answer the same way."""

    status = 503
    code = "not_ready"


class ClientGone(RuntimeServiceError):
    """The client closed its connection before its answers were ready (nginx's 499): nobody reads this answer, but the
    status is what /metrics and the access log count."""

    status = 499
    code = "client_closed_request"


class QuestionError(Exception):
    """One question cannot be answered; reported in place, siblings still answered."""

    def __init__(self, error: str, message: str):
        super().__init__(message)
        self.error = error
        self.message = message


TRANSIENT_MESSAGES = ("out of memory", "busy or unavailable", "device busy", "failed to allocate")


def is_transient(exc: BaseException) -> bool:
    """Whether a failed model load is worth another try: a download that broke off, a device that was busy
    or out of memory while the weights were placed. Verification failures never are."""
    if getattr(exc, "transient", False):
        return True
    if isinstance(exc, (PackageError, ArtifactError)):
        return False
    return isinstance(exc, (RuntimeError, MemoryError)) and any(text in str(exc).lower() for text in TRANSIENT_MESSAGES)
