"""uvicorn's access log (`server.access_log: true`) without credentials: a client may send its key
in the query string (`?api_key=`, `?key=`, `?token=`), which uvicorn writes as it came. The request
target of each line goes through `redact_credentials`, as the request log's lines do."""

from __future__ import annotations

import logging

from switchyard.core.urls import redact_credentials

ACCESS_LOGGER = "uvicorn.access"
_TARGET_ARG = 2  # uvicorn's args: (client, method, path with query string, HTTP version, status)


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        target = args[_TARGET_ARG] if isinstance(args, tuple) and len(args) > _TARGET_ARG else None
        if isinstance(args, tuple) and isinstance(target, str):
            # the args stay a tuple: uvicorn's AccessFormatter unpacks them
            record.args = (*args[:_TARGET_ARG], redact_credentials(target), *args[_TARGET_ARG + 1 :])
        else:
            record.msg, record.args = redact_credentials(record.getMessage()), ()
        return True


def install_access_log_redaction() -> None:
    """Put the filter on uvicorn's access logger, once (calling it again is harmless)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, RedactingFilter) for existing in logger.filters):
        logger.addFilter(RedactingFilter())
