"""A real S3 protocol server for tests: moto's server mode (PyPI `moto[s3]`, Flask) in a process of
its own on a free port of 127.0.0.1, so a test can stop it mid-run and start it again. `env()` is
what a client needs: S3_ENDPOINT_URL and credentials that belong to the test (the leak tests look
for them), with every AWS config file switched off so nothing of the machine's is read."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SECRET = "rgpt-test-secret-5ee9b1d07c"  # the credentials under test: never written by a run
KEY_ID = "RGPTTESTKEYID7F3A"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"S3_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> "S3Server":
        """Start (again, on the same port: a restarted server is empty) and wait until it answers."""
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                assert self.proc.poll() is None, "moto's server exited at start"
                time.sleep(0.1)
        raise AssertionError(f"moto's server did not answer on port {self.port} within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def client(self):
        import boto3
        env = self.env()
        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    def put_tree(self, local: Path, bucket: str, prefix: str) -> None:
        """Upload a directory as it is (the bucket created if missing)."""
        client = self.client()
        if bucket not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
            client.create_bucket(Bucket=bucket)
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))
