"""Test-only: with DPR_TEST_HOSTILE_READERS set, a process started with this folder on PYTHONPATH (a real
`dpr worker` in test_parse_on_workers.py) reads PDFs with ``kit.hostile_readers`` in its parser sandbox, whose
reader crashes the child (SIGSEGV) for a file named ``*crash*`` and reads any other PDF for real."""

import os

if os.environ.get("DPR_TEST_HOSTILE_READERS"):
    import services.readers.sandbox as _sandbox

    _sandbox.READERS["pdf"] = "kit.hostile_readers:by_name"
