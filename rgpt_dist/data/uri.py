"""Remote dataset URIs (s3://bucket/prefix and the other schemes mosaicml-streaming reads): what a
config may name, how a URI or endpoint is shown, and the error a failed read becomes. No torch.

Credentials never travel in a URI: streaming and boto3 take them from the environment
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, an instance role) and
the endpoint from S3_ENDPOINT_URL. A data.paths entry is recorded in config.yaml, checkpoints,
metrics and exports, so one carrying a user name, password or query string (a pre-signed URL's
signature) is refused when the config is validated.
"""
from __future__ import annotations

import os
import urllib.parse

SCHEMES = ("s3", "gs", "oci", "azure", "azure-dl", "hf", "dbfs", "sftp")


class RemoteDataError(RuntimeError):
    """A shard that could not be fetched from object storage after streaming's retries: names the
    shard, the URI and the endpoint. The run stops and asks to be requeued (it resumes from its
    newest checkpoint once the storage answers again)."""


def is_remote(path: str) -> bool:
    return "://" in path


def uri_problem(path: str) -> str | None:
    """Why a data.paths entry cannot be used as written, or None (local paths are checked later,
    by the preflight)."""
    if not is_remote(path):
        return None
    parts = urllib.parse.urlsplit(path)
    if parts.scheme not in SCHEMES:
        return f"scheme {parts.scheme!r} is not one streaming reads ({', '.join(SCHEMES)})"
    if "@" in parts.netloc or parts.query or parts.fragment:
        return ("a URI with a user, password, query or fragment would put credentials in config.yaml, "
                "checkpoints and exports: give the bare URI and the credentials in the environment "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE)")
    if not parts.netloc:
        return "no bucket (expected SCHEME://BUCKET/PREFIX)"
    if ".." in parts.path.split("/"):
        return "`..` in a dataset URI would be cached outside the cache directory"
    return None


def shown(url: str | None) -> str:
    """A URL as it may be printed: any user name or password in it replaced by `***`."""
    if not url:
        return ""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def endpoint(uri: str) -> str:
    """The endpoint a URI is read from, for messages: S3_ENDPOINT_URL for s3:// (credentials
    scrubbed), else the scheme's default service."""
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "s3":
        return shown(os.environ.get("S3_ENDPOINT_URL")) or "AWS S3 (no S3_ENDPOINT_URL)"
    return f"the {scheme}:// service"


def described(error: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters of it), for one-line reports."""
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
