"""OCR of a scan with Debian's tesseract, behind DPR_DOCUMENTS__OCR (off by default): skipped where tesseract is
not installed. A page that is only an image of text is read when OCR is on, and fails as no_text_layer when off."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.core.settings import DocumentSettings
from services.readers import Document, DocumentFailure, iter_documents
from services.readers.sandbox import ParserSandbox

pytestmark = pytest.mark.slow


def _scan(path: Path) -> Path:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (1700, 600), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=64)
    draw.text((80, 120), "The lighthouse keeper", fill=0, font=font)
    draw.text((80, 260), "climbs ninety stairs.", fill=0, font=font)
    image.save(path, resolution=200)
    return path


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed (apt-get install "
                    "tesseract-ocr tesseract-ocr-eng)")
def test_a_scan_is_read_with_ocr_on_and_reported_with_it_off(tmp_path: Path) -> None:
    scan = _scan(tmp_path / "scan.pdf")
    with ParserSandbox(DocumentSettings()) as off:
        (failure,) = list(iter_documents([scan], sandbox=off))
    assert isinstance(failure, DocumentFailure) and failure.reason == "no_text_layer"
    assert "DPR_DOCUMENTS__OCR" in failure.error
    limits = DocumentSettings(ocr=True)
    with ParserSandbox(limits) as on:
        (doc,) = list(iter_documents([scan], limits=limits, sandbox=on))
    assert isinstance(doc, Document) and doc.metadata["pages_ocr"] == 1
    assert "lighthouse keeper" in doc.text.lower() and "stairs" in doc.text.lower()
