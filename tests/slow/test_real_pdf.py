"""A real PDF manual from Debian's gnuplot-doc (fetched by scripts/fetch_debian_pdfs.sh; skipped when the package
archive cannot be reached): every page read, in order, under the outline's heading path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.readers import Document, iter_documents

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_gnuplot_manual_pages_and_headings(tmp_path: Path) -> None:
    fetched = subprocess.run([str(ROOT / "scripts/fetch_debian_pdfs.sh"), str(tmp_path), "gnuplot-doc"],
                             capture_output=True, text=True, check=False)
    if fetched.returncode != 0:
        pytest.skip(f"gnuplot-doc could not be fetched: {fetched.stderr.strip()}")
    folder = Path(fetched.stdout.strip())
    (doc,) = [i for i in iter_documents([folder / "gnuplot.pdf"]) if isinstance(i, Document)]
    assert doc.format == "pdf" and doc.metadata["pages"] > 250
    pages = [s.page for s in doc.sections]
    assert pages == sorted(pages) and pages[0] == 1 and len(pages) > 250
    png = [s for s in doc.sections if "set terminal png" in s.text]
    assert png and png[0].heading[:2] == ("IV Terminal types", "Complete list of terminals")
