"""services/lab/shared/dropout.py: training's dropout masks from numpy's PCG64, seeded from torch's generator."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit

torch = pytest.importorskip("torch")


def test_drops_each_element_with_probability_p_and_scales_the_rest_as_torch_does() -> None:
    from services.lab.shared.dropout import drop as dropout

    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, 0.1, True)
    dropped = (y == 0).float().mean().item()
    assert 0.098 < dropped < 0.102  # 400k draws: sd 0.0005
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 65536 / (65536 - 6554)))  # 1 / (1 - 0.100006)
    assert abs(y.mean().item() - 1.0) < 0.003  # unbiased, as F.dropout
    bf16 = dropout(x.bfloat16(), 0.5, True)
    assert bf16.dtype == torch.bfloat16 and 0.49 < (bf16 == 0).float().mean().item() < 0.51


def test_without_training_or_p_it_is_the_identity_and_p_one_drops_everything() -> None:
    from services.lab.shared.dropout import drop as dropout

    x = torch.randn(3, 5)
    assert torch.equal(dropout(x, 0.1, False), x)
    assert torch.equal(dropout(x, 0.0, True), x)
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))


def test_the_same_torch_rng_state_gives_the_same_masks_as_gradcache_replays_it() -> None:
    from services.lab.shared.dropout import drop as dropout

    x = torch.randn(8, 64, 64)
    torch.manual_seed(7)
    a = dropout(x, 0.1, True)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.1, True), a)
    state = torch.get_rng_state()
    b = dropout(x, 0.1, True)
    c = dropout(x, 0.1, True)
    assert not torch.equal(b, c)  # each mask draws anew
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.1, True), b)


def test_its_gradient_is_the_mask_times_the_scale() -> None:
    from services.lab.shared.dropout import drop as dropout

    torch.manual_seed(1)
    x = (torch.rand(1000) + 0.5).requires_grad_()
    y = dropout(x, 0.3, True)
    (y * 2).sum().backward()
    scale = 65536 / (65536 - round(0.3 * 65536))
    assert x.grad is not None
    assert torch.allclose(x.grad, (y != 0).float() * 2 * scale)


def test_a_model_inside_drops_out_with_it_computes_eager_attention_and_is_given_back_as_it_was() -> None:
    from sentence_transformers import SentenceTransformer
    from transformers.models.bert.modeling_bert import eager_attention_forward

    from encoders.towers import base_model_path
    from services.lab.shared import dropout as module
    from services.lab.shared.dropout import ATTENTION, fast_dropout

    model = SentenceTransformer(str(base_model_path()), device="cpu", local_files_only=True)
    transformer = model[0].auto_model
    texts = ["how do the towers train", "a passage about dense retrieval and its hard negatives, longer"]
    before = model.encode(texts, convert_to_tensor=True)
    assert transformer.config._attn_implementation == "sdpa"
    features = model.tokenize(texts)
    with fast_dropout(model):
        assert all(layer.attention.self.config._attn_implementation == ATTENTION for layer in transformer.encoder.layer)
        during = model.encode(texts, convert_to_tensor=True)  # eval: no dropout, the padding masked
        model.train()
        calls: list[float] = []
        real = module.drop
        module.drop = lambda x, p, training: calls.append(p) or real(x, p, training)  # type: ignore[assignment]
        try:
            torch.manual_seed(5)
            a = model(dict(features))["sentence_embedding"]
            torch.manual_seed(5)
            b = model(dict(features))["sentence_embedding"]
        finally:
            module.drop = real
        model.eval()
    assert torch.allclose(before, during, atol=1e-5)
    assert torch.equal(a, b) and not torch.allclose(a, before, atol=1e-3)  # dropped out, the same masks again
    assert len(calls) == 2 * (1 + 6 * 3) and set(calls) == {0.1}  # embeddings + 6 layers x (attention, 2 outputs)
    assert transformer.config._attn_implementation == "sdpa"
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.allclose(model.encode(texts, convert_to_tensor=True), before, atol=1e-6)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 12, 9, 32) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 9)
    mask[1, ..., 6:] = torch.finfo(torch.float32).min
    layer = torch.nn.Module().eval()
    want = eager_attention_forward(layer, q, k, v, mask, scaling=0.125, dropout=0.1)
    got = module._attend(layer, q, k, v, mask, scaling=0.125, dropout=0.1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_another_transformer_on_sdpa_attends_eagerly_inside_and_gets_sdpa_back() -> None:
    from transformers import DistilBertConfig, DistilBertModel

    from services.lab.shared.dropout import fast_dropout

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=50, dim=32, hidden_dim=64, n_layers=1, n_heads=2, max_position_embeddings=16)
    model = torch.nn.Sequential(DistilBertModel(config).eval())  # not a BERT-like one: transformers' own eager
    transformer = model[0]
    transformer.set_attn_implementation("sdpa")
    ids = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 4, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    before = transformer(input_ids=ids, attention_mask=mask).last_hidden_state
    with fast_dropout(model):
        assert transformer.config._attn_implementation == "eager"
        during = transformer(input_ids=ids, attention_mask=mask).last_hidden_state
    assert transformer.config._attn_implementation == "sdpa"
    assert torch.allclose(before, during, atol=1e-5)
