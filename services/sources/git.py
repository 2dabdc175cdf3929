"""A git repository (``git+https://host/repo.git``, ``git+file:///path/repo``, a path or URL ending in ``.git``)
followed on one branch (the source's ``branch``, else the repository's HEAD), through the ``git`` command.

The repository is mirrored bare under the source's folder (``DATA_DIR/sources/NAME/repo.git``) and fetched at each
sync; the items are the files of the branch's head commit (``git ls-tree``), version = the file's blob id. From one
commit to the next a file keeps its blob id unless a commit between them touched it, so the sync reads exactly the
files the commits changed (the diff of the two trees), whatever the number of commits or a force-push between.
Symbolic links and submodules are not items. A fetch that fails is ``SourceUnreachable``: the sync stops, nothing
is deleted. Credentials belong to git (a credential helper, an SSH key); a URL's password is never shown.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from services.sources.kinds import Entry, ItemFailed, SourceError, SourceUnreachable

if TYPE_CHECKING:
    from services.sources.registry import SourceSpec

_TIMEOUT_S = 600.0
_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "LC_ALL": "C"}  # never wait for a password on a terminal


def repo_url(uri: str) -> str:
    url = uri.removeprefix("git+")
    return url[len("file://"):] if url.startswith("file://") else url


def shown(url: str) -> str:
    """``url`` with any password replaced (``https://user:***@host/...``)."""
    return re.sub(r"(://[^/:@]+):[^/@]*@", r"\1:***@", url)


class GitSource:
    def __init__(self, spec: SourceSpec, workdir: Path) -> None:
        self.spec = spec
        self.url = repo_url(spec.uri)
        self.mirror = workdir / "repo.git"
        self.commit = ""  # the head commit the listing read
        self._reader: subprocess.Popen[bytes] | None = None

    def listing(self) -> Iterator[Entry]:
        self.commit = self._fetch()
        out = self._git("ls-tree", "-r", "-z", "--long", "--full-tree", self.commit)
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, _, raw_path = record.partition(b"\t")
            mode, kind, blob, size = meta.split()
            if kind != b"blob" or mode == b"120000":  # submodules and symbolic links are not files
                continue
            yield Entry(os.fsdecode(raw_path), blob.decode(), int(size))

    def fetch(self, entry: Entry, dest: Path) -> Path:
        reader = self._cat()
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(entry.version.encode() + b"\n")
        reader.stdin.flush()
        header = reader.stdout.readline().split()
        if len(header) != 3:
            raise ItemFailed("unreadable", f"{self.spec.name}/{entry.key}: blob {entry.version} is missing from the "
                             "mirror; the next sync fetches it again")
        size = int(header[2])
        target = dest / entry.key
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            _copy(reader.stdout, f, size)
        reader.stdout.read(1)  # the newline after the content
        return target

    def close(self) -> None:
        if self._reader is not None:
            for pipe in (self._reader.stdin, self._reader.stdout):
                if pipe is not None:
                    pipe.close()
            self._reader.wait(timeout=30)
            self._reader = None

    def _fetch(self) -> str:
        """Bring the mirror up to the remote; the head commit of the branch followed."""
        where = shown(self.url)
        if not (self.mirror / "HEAD").is_file():
            self.mirror.parent.mkdir(parents=True, exist_ok=True)
            self._run(["git", "init", "--bare", "-q", str(self.mirror)], "create the mirror")
        ref = f"refs/heads/{self.spec.branch}" if self.spec.branch else "HEAD"
        self._run(["git", "-C", str(self.mirror), "fetch", "--quiet", "--no-tags", self.url, f"+{ref}:refs/dpr/head"],
                  f"fetch {ref.removeprefix('refs/heads/')} from {where}")
        return self._git("rev-parse", "refs/dpr/head^{commit}").decode().strip()

    def _run(self, argv: list[str], what: str) -> None:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=_TIMEOUT_S, env={**os.environ, **_ENV})
        except subprocess.TimeoutExpired:
            raise SourceUnreachable(f"source {self.spec.name}: git could not {what} within {_TIMEOUT_S:.0f} s; check "
                                    f"the network, then `dpr sources sync {self.spec.name}`") from None
        if done.returncode != 0:
            why = shown(done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:][0]
                        if done.stderr.strip() else f"exit {done.returncode}")
            if "couldn't find remote ref" in why or "invalid refspec" in why:
                raise SourceError(f"source {self.spec.name}: {shown(self.url)} has no branch "
                                  f"{self.spec.branch!r} ({why}); check --branch")
            raise SourceUnreachable(f"source {self.spec.name}: git could not {what} ({why}); check the URL, the "
                                    f"network and git's credentials, then `dpr sources sync {self.spec.name}`")

    def _git(self, *args: str) -> bytes:
        done = subprocess.run(["git", "-C", str(self.mirror), *args], capture_output=True, timeout=_TIMEOUT_S,
                              env={**os.environ, **_ENV})
        if done.returncode != 0:
            raise SourceError(f"source {self.spec.name}: git {args[0]} failed in {self.mirror} "
                              f"({done.stderr.decode('utf-8', 'replace').strip()}); remove the source's mirror "
                              "folder and sync again")
        return done.stdout

    def _cat(self) -> subprocess.Popen[bytes]:
        if self._reader is None:
            self._reader = subprocess.Popen(["git", "-C", str(self.mirror), "cat-file", "--batch"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, env={**os.environ, **_ENV})
        return self._reader


def _copy(src: IO[bytes], dst: IO[bytes], size: int) -> None:
    left = size
    while left:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            raise ItemFailed("unreadable", "git cat-file ended early")
        dst.write(chunk)
        left -= len(chunk)
