"""Keep S3 error responses parseable when the server sends a checksum header with them.

botocore (>= 1.36, open bug boto/boto3#4754) wraps a GetObject body in a checksum-validating stream
whenever the response carries `x-amz-checksum-*`, even on an error status. Its parser then calls
`.strip()` on that stream and raises AttributeError instead of a ClientError, so a 5xx that its own
retry handler would have retried escapes as a crash. S3-compatible servers do send such headers on
a 5xx (rclone's `serve s3` does when an object is replaced while it is read).
"""

from __future__ import annotations

from typing import Any

from botocore.response import StreamingBody


def _unwrap_error_body(response_dict: dict[str, Any], **_: Any) -> None:
    # The error bytes were already read into the plain response (and the wrapper holds the spent raw
    # stream); an empty body makes botocore raise a ClientError coded by the HTTP status.
    if response_dict.get("status_code", 200) >= 300 and isinstance(response_dict.get("body"), StreamingBody):
        response_dict["body"] = b""


def install(client: Any) -> Any:
    """Register the fix on a boto3 S3 client; returns the client."""
    client.meta.events.register("before-parse.s3.*", _unwrap_error_body)
    return client
