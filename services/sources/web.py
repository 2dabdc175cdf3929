"""``http(s)://site/path/``: the pages of a web site under one path, through httpx.

The listing reads ``robots.txt`` (its rules for ``dpr-ingest`` or ``*`` are honoured, its ``Sitemap:`` lines used),
then the sitemap (``sitemap.xml`` at the site's root, or those robots.txt names; one level of sitemap index) if
there is one, else follows links from the start page breadth-first, never leaving the start path, never a URL with
a query. Each page is fetched once per sync (its links are needed to list the site) into the sync's fetch folder;
version = the sha256 of its bytes, so an unchanged page is never parsed or encoded again. HTML pages and PDFs are
items (read by the product's own readers); other types are not.

Safe to point at the world: every request's host (the start URL, each redirect, each link) is resolved first and
refused when any of its addresses is loopback, private, link-local, multicast, reserved or unspecified, unless
``DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES`` (tests set it); redirects are followed by hand (at most 5), each checked
the same way; bodies are read in pieces and cut at ``DPR_SOURCES__MAX_PAGE_BYTES``; a crawl stops at
``MAX_PAGES`` pages, ``MAX_DEPTH`` links deep or ``MAX_TOTAL_BYTES``, and a crawl stopped by a limit is a listing
cut short: the sync reads nothing and removes nothing, naming the limit to raise.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.robotparser import RobotFileParser

from services.sources.kinds import Entry, ItemFailed, SourceError, SourceUnreachable

if TYPE_CHECKING:
    from services.core.settings import Settings
    from services.sources.registry import SourceSpec

AGENT = "dpr-ingest"
MAX_REDIRECTS = 5
_PAGE_TYPES = {"text/html": ".html", "application/xhtml+xml": ".html", "application/pdf": ".pdf"}


class Refused(Exception):
    """A URL the source may not fetch (a private address, another site, robots.txt)."""


def check_host(host: str, allow_private: bool) -> None:
    """Raise ``Refused`` when ``host`` resolves to an address a source may not reach (see the module)."""
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise SourceUnreachable(f"cannot resolve {host} ({e.strerror or e})") from None
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if (address.is_loopback or address.is_private or address.is_link_local or address.is_multicast
                or address.is_reserved or address.is_unspecified):
            raise Refused(f"{host} resolves to {address}, a loopback, private or link-local address; sources may not "
                          "reach those unless DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES=true")


class WebSource:
    def __init__(self, spec: SourceSpec, settings: Settings, fetch_dir: Path) -> None:
        import httpx

        self.spec = spec
        self.limits = settings.sources
        self.max_page = min(self.limits.max_page_bytes, max(settings.max_document_bytes,
                                                            settings.documents.max_file_bytes))
        start = spec.uri if urlsplit(spec.uri).path else spec.uri + "/"
        self.start = start
        parts = urlsplit(start)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.base = parts.path if parts.path.endswith("/") else parts.path.rsplit("/", 1)[0] + "/"
        self.dir = fetch_dir
        self._client = httpx.Client(timeout=self.limits.timeout_s, follow_redirects=False,
                                    headers={"User-Agent": f"{AGENT} (+docs/sources.md)"})
        self._files: dict[str, Path] = {}
        self._robots: RobotFileParser | None = None
        self._total = 0

    # --- the listing ------------------------------------------------------------------------------------------
    def listing(self) -> Iterator[Entry]:
        self.dir.mkdir(parents=True, exist_ok=True)
        sitemaps = self._read_robots()
        pages = self._sitemap_urls(sitemaps)
        seen: set[str] = set()
        queue: deque[tuple[str, int]] = deque((url, 0) for url in (pages or [self.start]))
        follow = not pages
        while queue:
            url, depth = queue.popleft()
            if url in seen or not self._inside(url) or not self._allowed(url):
                continue
            seen.add(url)
            if len(self._files) >= self.limits.max_pages:
                raise SourceError(f"source {self.spec.name}: over {self.limits.max_pages:,} pages under {self.start}; "
                                  "nothing is read or removed from a listing cut short: raise "
                                  "DPR_SOURCES__MAX_PAGES, or narrow the source's path or --include")
            got = self._get(url)
            if got is None:
                continue
            final, body, kind = got
            key = self._key(final, kind)
            if key is None or key in self._files:
                continue
            path = self.dir / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            self._files[key] = path
            yield Entry(key, hashlib.sha256(body).hexdigest(), len(body))
            if follow and kind == ".html" and depth < self.limits.max_depth:
                queue.extend((link, depth + 1) for link in _links(final, body) if link not in seen)

    def fetch(self, entry: Entry, dest: Path) -> Path:
        path = self._files.get(entry.key)
        if path is None or not path.is_file():
            raise ItemFailed("gone", f"{self.start}{entry.key}: not fetched by this listing")
        return path

    def close(self) -> None:
        self._client.close()

    # --- one request ------------------------------------------------------------------------------------------
    def _get(self, url: str) -> tuple[str, bytes, str] | None:
        """The page at ``url`` after its redirects: (final URL, bytes, suffix), or None for a page that is not an
        item (4xx, another type, a redirect out of the start path). A page too large is cut and refused."""
        import httpx

        for _ in range(MAX_REDIRECTS + 1):
            try:
                check_host(urlsplit(url).hostname or "", self.limits.allow_private_addresses)
            except Refused as e:
                if url == self.start:
                    raise SourceError(f"source {self.spec.name}: {e}") from None
                return None
            try:
                with self._client.stream("GET", url) as response:
                    if response.is_redirect:
                        url = urldefrag(urljoin(url, response.headers.get("location", "")))[0]
                        if not self._inside(url):
                            return None
                        continue
                    if response.status_code >= 500 or response.status_code == 429:
                        raise SourceUnreachable(f"source {self.spec.name}: {url} answered {response.status_code}; "
                                                f"try again later (`dpr sources sync {self.spec.name}`)")
                    if response.status_code != 200:
                        if url == self.start:
                            raise SourceError(f"source {self.spec.name}: {url} answered {response.status_code}; "
                                              "check the URL")
                        return None
                    kind = _PAGE_TYPES.get(response.headers.get("content-type", "").split(";")[0].strip().lower())
                    if kind is None:
                        return None
                    body = self._body(response, url)
                    return url, body, kind
            except httpx.HTTPError as e:
                raise SourceUnreachable(f"source {self.spec.name}: cannot reach {url} ({type(e).__name__}); check the "
                                        f"URL and the network, then `dpr sources sync {self.spec.name}`") from None
        return None  # too many redirects: not an item

    def _body(self, response: Any, url: str) -> bytes:
        parts, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            self._total += len(chunk)
            if size > self.max_page:
                raise SourceError(f"source {self.spec.name}: {url} is over {self.max_page:,} bytes; raise "
                                  "DPR_SOURCES__MAX_PAGE_BYTES or --exclude it")
            if self._total > self.limits.max_total_bytes:
                raise SourceError(f"source {self.spec.name}: the site under {self.start} is over "
                                  f"{self.limits.max_total_bytes:,} bytes; raise DPR_SOURCES__MAX_TOTAL_BYTES or "
                                  "narrow the path (nothing is removed from a listing cut short)")
            parts.append(chunk)
        return b"".join(parts)

    # --- what is in scope --------------------------------------------------------------------------------------
    def _inside(self, url: str) -> bool:
        parts = urlsplit(url)
        return (f"{parts.scheme}://{parts.netloc}" == self.origin and not parts.query
                and (parts.path or "/").startswith(self.base))

    def _allowed(self, url: str) -> bool:
        return self._robots is None or self._robots.can_fetch(AGENT, url)

    def _key(self, url: str, kind: str) -> str | None:
        """The item key of a page: its path under the start path (``library/os.html``); a folder's page is its
        ``index.html``; an HTML page without an HTML name gets ``.html``."""
        rel = urlsplit(url).path[len(self.base):]
        if not rel or rel.endswith("/"):
            rel += "index.html"
        if ".." in PurePosixPath(rel).parts:
            return None
        suffix = PurePosixPath(rel).suffix.lower()
        if kind == ".html" and suffix not in (".html", ".htm"):
            rel += ".html"
        return rel  # --include / --exclude are applied by the sync: an excluded page's links are still followed

    def _read_robots(self) -> list[str]:
        got = self._get_text(f"{self.origin}/robots.txt")
        if got is None:
            return []
        robots = RobotFileParser()
        robots.parse(got.splitlines())
        self._robots = robots
        if not robots.can_fetch(AGENT, self.start):
            raise SourceError(f"source {self.spec.name}: {self.origin}/robots.txt disallows {self.start} for "
                              f"{AGENT}; nothing is read")
        return list(robots.site_maps() or [])

    def _sitemap_urls(self, named: list[str]) -> list[str]:
        for where in named or [f"{self.origin}/sitemap.xml"]:
            text = self._get_text(where)
            if text is None:
                continue
            urls = _locs(text)
            nested = [u for u in urls if u.endswith(".xml")]
            for sub in nested[:50]:  # a sitemap index: one level
                urls.extend(_locs(self._get_text(sub) or ""))
            pages = [u for u in dict.fromkeys(urls) if not u.endswith(".xml") and self._inside(u)]
            if pages:
                return pages
        return []

    def _get_text(self, url: str) -> str | None:
        """A small text file (robots.txt, a sitemap) at ``url``, or None when there is none."""
        import httpx

        try:
            check_host(urlsplit(url).hostname or "", self.limits.allow_private_addresses)
        except Refused as e:
            raise SourceError(f"source {self.spec.name}: {e}") from None
        try:
            response = self._client.get(url)
        except httpx.HTTPError as e:
            raise SourceUnreachable(f"source {self.spec.name}: cannot reach {url} ({type(e).__name__}); check the "
                                    f"URL and the network, then `dpr sources sync {self.spec.name}`") from None
        if response.status_code >= 500:
            raise SourceUnreachable(f"source {self.spec.name}: {url} answered {response.status_code}; try again later")
        if response.status_code != 200 or len(response.content) > self.max_page:
            return None
        return response.text


def _links(url: str, body: bytes) -> list[str]:
    from lxml import html as lhtml

    try:
        tree = lhtml.fromstring(body)
    except (ValueError, lhtml.etree.ParserError):
        return []
    out = []
    for href in tree.xpath("//a/@href"):
        link = urldefrag(urljoin(url, str(href).strip()))[0]
        if link.startswith(("http://", "https://")):
            out.append(link)
    return out


def _locs(text: str) -> list[str]:
    try:
        root = ET.fromstring(text)  # noqa: S314 - no entity expansion in ElementTree; size bounded above
    except ET.ParseError:
        return []
    return [el.text.strip() for el in root.iter() if el.tag.endswith("loc") and el.text]
