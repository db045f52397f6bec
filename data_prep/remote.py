"""rgpt-prep --out s3://bucket/prefix: the dataset is built locally as for a local --out (same
bytes, same resumable staging), then uploaded with mosaicml-streaming's uploader (the endpoint from
S3_ENDPOINT_URL, credentials from the AWS environment), manifest.json last: a prefix without one is
not a dataset, so a reader never takes a half-uploaded prefix for a complete one (rgpt-train's
preflight fetches each split's index.json before the run starts).

The local build goes to --local DIR (kept), else to a private per-user cache directory (removed once
uploaded). An upload that fails is reported with the file and the endpoint; rerunning the command
rebuilds (resuming its parts) and uploads again.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rgpt_dist.data.cache import cache_dir
from rgpt_dist.data.uri import described, endpoint, uri_problem
from rgpt_dist.data.mds import import_streaming


class RemoteOutputError(Exception):
    """An --out URI that cannot be written, with the reason."""


def _uploader(uri: str, local: Path):
    try:
        return import_streaming().base.storage.CloudUploader.get((str(local), uri.rstrip("/")), keep_local=True,
                                                                 exist_ok=True)
    except Exception as e:  # no bucket, no credentials, an endpoint that does not answer
        raise RemoteOutputError(f"{uri} at {endpoint(uri)}: {described(e)}") from None


def local_build_dir(uri: str, local: str | None) -> Path:
    """Where the dataset for `uri` is built before the upload."""
    if problem := uri_problem(uri):
        raise RemoteOutputError(f"--out {uri}: {problem}")
    if local:
        return Path(local)
    return cache_dir("prep") / uri.replace("://", "/")


def check_remote_out(uri: str, overwrite: bool) -> None:
    """Refuse a prefix that already holds a dataset (its manifest.json) unless --overwrite."""
    scratch = cache_dir("prep")
    up = _uploader(uri, scratch)
    try:
        existing = up.list_objects("manifest.json")
    except Exception as e:
        raise RemoteOutputError(f"{uri} at {endpoint(uri)}: {described(e)}") from None
    if existing and not overwrite:
        raise RemoteOutputError(f"--out {uri} already holds a dataset (manifest.json): pass --overwrite to "
                                "replace it (readers must not read it while it is replaced)")


def upload(local: Path, uri: str, remove_local: bool) -> None:
    """Every file of the built dataset, manifest.json last; then the local build removed if asked."""
    up = _uploader(uri, local)
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    files = [f for f in files if f != "manifest.json"] + ["manifest.json"]
    total = 0
    for name in files:
        try:
            up.upload_file(name)
        except Exception as e:
            raise RemoteOutputError(f"uploading {local / name} to {uri.rstrip('/')}/{name} at {endpoint(uri)}: "
                                    f"{described(e)} (the local build stays in {local}; "
                                    "run the command again)") from None
        total += (local / name).stat().st_size
    print(f"uploaded {len(files)} files ({total / 1e6:.1f} MB) to {uri}", file=sys.stderr)
    if remove_local:
        shutil.rmtree(local)
