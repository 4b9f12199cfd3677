"""tokamax_cpp.transformers: tiny random-weight models of real MoE architectures (Qwen3-MoE,
OLMoE, Mixtral) and a dense one (Llama), patched and stock side by side: logits, greedy
generation, the library actually called, revert back to stock bit for bit, training falling
back to the stock backend."""

import warnings

import pytest
import torch

import tokamax_cpp as tc
from tokamax_cpp.transformers import apply_tokamax, patched_modules, revert_tokamax

transformers = pytest.importorskip("transformers")

_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)


def _model(kind: str, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**_COMMON, moe_intermediate_size=32, num_experts=8,
                                          num_experts_per_tok=2, intermediate_size=96,
                                          head_dim=16)
    elif kind == "olmoe":
        cfg = transformers.OlmoeConfig(**_COMMON, intermediate_size=32, num_experts=8,
                                       num_experts_per_tok=2)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**_COMMON, intermediate_size=48, num_local_experts=4,
                                         num_experts_per_tok=2)
    else:
        cfg = transformers.LlamaConfig(**_COMMON, intermediate_size=96)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    # Trained-scale expert weights (the default init leaves some at zero).
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj"):
                m.gate_up_proj.normal_(std=0.1)
                m.down_proj.normal_(std=0.1)
    return model


def _ids(batch=2, length=11):
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["qwen3_moe", "olmoe", "mixtral", "llama"])
@pytest.mark.parametrize("pack", [True, False])
def test_patched_logits_and_generation_match_stock(kind, pack):
    model = _model(kind)
    ids = _ids()
    with torch.no_grad():
        stock = model(ids).logits
        stock_tokens = model.generate(ids[:1], max_new_tokens=32, do_sample=False)
    apply_tokamax(model, pack_experts=pack, linear=True)
    counts = patched_modules(model)
    # Two a layer (four with Qwen3's and OLMoE's query and key norms) and the final one.
    assert counts["norms"] == 2 * (4 if kind in ("qwen3_moe", "olmoe") else 2) + 1
    assert counts["experts"] == (0 if kind == "llama" else 2)
    # q, k, v, o a layer, the dense MLP's three (Llama), the router (Qwen3-MoE, OLMoE and
    # Mixtral's gate is a Linear too, except where it is its own router class) and lm_head.
    assert counts["linears"] >= 2 * 4 + 1
    assert counts["attention"] == 1
    assert model.config._attn_implementation == "tokamax"
    with torch.no_grad():
        ours = model(ids).logits
        ours_tokens = model.generate(ids[:1], max_new_tokens=32, do_sample=False)
    # f32 throughout; the sums run in other orders.
    torch.testing.assert_close(ours, stock, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours_tokens, stock_tokens)


def test_bf16_model_logits_match_stock():
    model = _model("qwen3_moe", torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        stock = model(ids).logits.float()
        stock_step = model(ids[:1, :1]).logits
        apply_tokamax(model, linear=True)
        ours = model(ids).logits.float()
        ours_step = model(ids[:1, :1]).logits  # one row: every Linear on the library
    # bf16 rounds each layer's results; normwise relative difference.
    assert ((ours - stock).norm() / stock.norm()).item() < 2e-2
    assert ours_step.dtype == torch.bfloat16
    diff = (ours_step.float() - stock_step.float()).norm() / stock_step.float().norm()
    assert diff.item() < 2e-2


def test_the_library_serves_the_patched_modules():
    model = _model("qwen3_moe")
    apply_tokamax(model, pack_experts=False, linear=True)
    ids = _ids()

    def forward():
        with torch.no_grad():
            model(ids)

    ops = [b.op for b in tc.get_bound_args(forward)]
    assert ops.count("moe_experts") == 2, ops
    assert ops.count("layer_norm") >= 5, ops
    ops = [b.op for b in tc.get_bound_args(lambda: model.generate(ids[:1], max_new_tokens=2,
                                                                  do_sample=False))]
    assert "ragged_dot" in ops, ops  # the decode step's Linears


def test_revert_restores_the_stock_model_bit_for_bit():
    model, never = _model("qwen3_moe"), _model("qwen3_moe")
    ids = _ids()
    apply_tokamax(model, linear=True)
    with pytest.raises(ValueError, match="already patched"):
        apply_tokamax(model)
    revert_tokamax(model)
    assert patched_modules(model) == {"experts": 0, "norms": 0, "linears": 0, "attention": 0}
    with torch.no_grad():
        assert torch.equal(model(ids).logits, never(ids).logits)
    with pytest.raises(ValueError, match="not patched"):
        revert_tokamax(model)


def test_training_falls_back_to_the_stock_experts_and_matches_its_gradients():
    ids = _ids()
    grads = []
    for patch in (False, True):
        model = _model("qwen3_moe").train()
        if patch:
            apply_tokamax(model, linear=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads.append(model.model.layers[0].mlp.experts.gate_up_proj.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_unsupported_modules_are_left_with_a_warning():
    model = _model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    experts.act_fn = torch.nn.Tanh()  # an activation the library lacks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_tokamax(model)
    assert any("model.layers.0.mlp.experts" in str(w.message) and "Tanh" in str(w.message)
               for w in caught)
    assert patched_modules(model)["experts"] == 1
    ids = _ids()
    with torch.no_grad():
        ours = model(ids).logits
        revert_tokamax(model)
        stock = model(ids).logits
    torch.testing.assert_close(ours, stock, rtol=1e-4, atol=1e-4)


def test_bench_models_times_stock_and_patched(tmp_path, capsys):
    from tokamax_cpp import bench_models

    out = tmp_path / "models.json"
    assert bench_models.main(["--model", "tiny_qwen3_moe", "--layers", "1", "--rounds", "2",
                              "--gap-ms", "0", "--prefill", "16", "--generate", "3",
                              "--json", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert [r["step"] for r in doc["rows"]] == ["decode batch 1", "decode batch 8", "prefill 16",
                                                "generate 3 tokens"]
    gen = doc["rows"][-1]
    assert gen["tokamax_tokens_per_s"] == pytest.approx(3 / (gen["tokamax_ms"] / 1e3))
    for r in doc["rows"]:
        assert len(r["stock_samples"]) == len(r["tokamax_samples"]) == 2
        assert r["speedup"] > 0
    assert "| decode batch 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("pack", [True, False])
def test_apply_tokamax_to_patches_the_classes_before_the_model_exists(pack, monkeypatch):
    from tokamax_cpp.transformers import apply_tokamax_to
    from transformers.models.qwen3_moe import modeling_qwen3_moe as mq

    stock_forwards = (mq.Qwen3MoeExperts.forward, mq.Qwen3MoeRMSNorm.forward)
    ids = _ids()
    model = _model("qwen3_moe")
    with torch.no_grad():
        stock = model(ids).logits
    apply_tokamax_to("qwen3_moe", pack_experts=pack)
    try:
        with pytest.raises(ValueError, match="already patched"):
            apply_tokamax_to("qwen3_moe")
        calls = {"moe": 0, "norm": 0}
        moe = tc.moe_experts_packed if pack else torch.ops.tokamax.moe_experts
        norm = tc.torch_ops.rms_norm

        def count(kind, fn):
            def wrapped(*a, **k):
                calls[kind] += 1
                return fn(*a, **k)
            return wrapped

        if pack:
            monkeypatch.setattr(tc, "moe_experts_packed", count("moe", moe))
        monkeypatch.setattr(tc.torch_ops, "rms_norm", count("norm", norm))
        # A model built after the patch (as from_pretrained would) and the one built before.
        later = _model("qwen3_moe")
        with torch.no_grad():
            ours = model(ids).logits
            ours_later = later(ids).logits
        torch.testing.assert_close(ours, stock, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours_later, stock, rtol=1e-4, atol=1e-4)
        assert calls["norm"] > 0
        assert calls["moe"] == (4 if pack else 0)  # two layers, two models
        # Weights written in place after the first call (loading, a training step): the packed
        # copy follows them.
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, mq.Qwen3MoeExperts):
                    m.down_proj.mul_(-0.5)
            changed = model(ids).logits
    finally:
        revert_tokamax("qwen3_moe")
    assert (mq.Qwen3MoeExperts.forward, mq.Qwen3MoeRMSNorm.forward) == stock_forwards
    assert not hasattr(mq.Qwen3MoeRMSNorm, "_tokamax_stock_forward")
    with torch.no_grad():
        torch.testing.assert_close(changed, model(ids).logits, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(changed, stock, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="not patched"):
        revert_tokamax("qwen3_moe")
    with pytest.raises(ValueError, match="no model type"):
        apply_tokamax_to("no_such_model")


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_attention_with_padding_masks_matches_sdpa(kind, monkeypatch):
    # Left-padded batches (a bool mask per row) in prefill and every decode step: the same
    # logits and tokens as transformers' sdpa, and the library's attention actually called.
    model = _model(kind)
    ids = _ids(batch=3, length=9)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    with torch.no_grad():
        stock = model(ids, attention_mask=mask).logits
        stock_tokens = model.generate(ids, attention_mask=mask, max_new_tokens=12,
                                      do_sample=False)
    apply_tokamax(model, experts=False, norm=False)
    calls = []
    attention = tc.torch_ops.dot_product_attention
    monkeypatch.setattr(tc.torch_ops, "dot_product_attention",
                        lambda *a, **k: calls.append(k.get("mask") is not None) or
                        attention(*a, **k))
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).logits
        ours_tokens = model.generate(ids, attention_mask=mask, max_new_tokens=12,
                                     do_sample=False)
    assert calls and any(calls)  # called, with masks
    keep = mask.bool()  # padded query rows attend to nothing meaningful: compare the rest
    torch.testing.assert_close(ours[keep], stock[keep], rtol=1e-4, atol=1e-4)
    assert torch.equal(ours_tokens, stock_tokens)
    revert_tokamax(model)
    assert model.config._attn_implementation == "sdpa"
