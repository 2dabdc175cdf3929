"""The model lifecycle: re-embed the stored passages into a new generation, verify, swap atomically, roll back, gc.

Plain functions over the ``VectorStore`` protocol (never Celery). One module per step:

- ``state``: the re-embed record (in the target generation's spec settings), its statuses and errors;
- ``copy``: ``plan`` (resume or create the target generation) and the copy from stored passage text;
- ``verify``: catch-up (copy what changed, delete what went) and verification;
- ``gate``: the promotion gate (`dpr eval` of the candidate against the active model), wired once;
- ``swap``: ``finalize`` (catch up, gate, verify and swap under the write fence) and ``run_in_process``;
- ``rollback``, ``gc``: the alias back to the previous generation; dropping old generations;
- ``models``: a model's name by fingerprint, the ACTIVE model after a swap, the beat's "is a re-embed needed?";
- ``locks``: the re-embed lease (over ``services.core.locks``, which holds the collection's write fence);
- ``progress``: a re-embed spread over workers as a job of ``services.jobs`` (batches sent / done, result);
- ``inprocess`` / ``distributed``: the whole re-embed here, or submitted to workers through a ``Sender``.

The operations the entry points and the workers call: ``reembed_in_process``, ``submit_reembed``,
``copy_sent_batch``, ``finalize_sent``, ``check_and_submit``, ``reembed_status``, ``reembed_progress`` (the
broker's side alone), ``rollback_collection``, ``gc_collection``. The store-level ``gc``, ``rollback`` and
``verify`` are imported from their modules (a re-export would shadow the module of the same name).
docs/model-lifecycle.md says which guarantee each step keeps.
"""

from __future__ import annotations

from services.lifecycle.copy import copy_batch, pending_batches, plan
from services.lifecycle.distributed import (
    Submitted,
    check_and_submit,
    copy_sent_batch,
    finalize_sent,
    reembed_progress,
    reembed_status,
    submit_reembed,
)
from services.lifecycle.gate import GateDecision, run_gate
from services.lifecycle.gc import gc_collection
from services.lifecycle.inprocess import reembed_in_process
from services.lifecycle.models import check_needed
from services.lifecycle.rollback import rollback_collection
from services.lifecycle.state import ReembedError, ReembedState, current_state, save_state
from services.lifecycle.swap import finalize, run_in_process

__all__ = [
    "GateDecision",
    "ReembedError",
    "ReembedState",
    "Submitted",
    "check_and_submit",
    "check_needed",
    "copy_batch",
    "copy_sent_batch",
    "current_state",
    "finalize",
    "finalize_sent",
    "gc_collection",
    "pending_batches",
    "plan",
    "reembed_in_process",
    "reembed_progress",
    "reembed_status",
    "rollback_collection",
    "run_gate",
    "run_in_process",
    "save_state",
    "submit_reembed",
]
