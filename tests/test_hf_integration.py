"""attach / detach on tiny random Llama, Qwen2, Qwen3 and Mistral models built here."""

import pytest
import torch
from conftest import tiny_model, token_mask

import elastic_attention as ea
from elastic_attention import ElasticConfig, InputError, UnsupportedModelError

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4, pool_first=6, pool_last=6)


def randomize_routers(model, seed=0):
    """Input-sensitive random routers: unit-variance-preserving weights, zero biases."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in ea.routers_of(model).values():
            for name, parameter in router.named_parameters():
                if name.endswith("bias"):
                    parameter.zero_()
                else:
                    noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                    parameter.copy_(noise * 2 / parameter.shape[1] ** 0.5)


def test_forced_full_reproduces_the_unmodified_model(family):
    model = tiny_model(family)
    ids = torch.randint(1, 97, (2, 45))
    with torch.no_grad():
        expected = model(ids).logits
    ea.attach(model, CONFIG)
    ea.force_routing(model, "full")
    with torch.no_grad():
        logits = model(ids).logits
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-4)
    report = ea.routing_report(model)
    assert report.msr.tolist() == [0.0, 0.0] and report.esr_mean.tolist() == [0.0, 0.0]


def test_forced_sparse_matches_masked_sdpa(family):
    model = tiny_model(family)
    ids = torch.randint(1, 97, (2, 45))
    ssa = token_mask(45, 8, "ssa", sink_blocks=1, local_blocks=2)
    with torch.no_grad():
        expected = model(ids, attention_mask=ssa[None, None].expand(2, 1, -1, -1)).logits
    ea.attach(model, CONFIG)
    ea.force_routing(model, "sparse")
    with torch.no_grad():
        logits = model(ids).logits
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-4)
    report = ea.routing_report(model)
    expected_esr = 1 - ssa.sum() / torch.ones(45, 45).tril().sum()
    torch.testing.assert_close(report.esr_last, expected_esr.expand(2).float())
    assert report.msr.tolist() == [1.0, 1.0]


def test_forced_head_set_routes_exactly_those_heads():
    model = tiny_model("llama", layers=3)
    ea.attach(model, CONFIG)
    heads = torch.tensor([[True, False], [False, False], [True, True]])
    ea.force_routing(model, heads)
    with torch.no_grad():
        model(torch.randint(1, 97, (1, 30)))
    report = ea.routing_report(model)
    assert torch.equal(report.decisions[0], heads)
    assert report.msr.item() == pytest.approx(3 / 6)
    with pytest.raises(ea.ConfigError, match="shape"):
        ea.force_routing(model, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ea.ConfigError, match="'full', 'sparse'"):
        ea.force_routing(model, "half")


def test_qwen3_router_reads_normalized_keys_before_rope():
    model = tiny_model("qwen3", layers=1).double()
    ea.attach(model, ElasticConfig(block_size=8, sink_tokens=8, local_tokens=8, xa_stride=4, pool_first=3, pool_last=2))
    seen = {}
    router = ea.routers_of(model)[0]
    router.register_forward_pre_hook(lambda module, args: seen.update(pooled=args[0]))
    attention = model.model.layers[0].self_attn
    attention.register_forward_pre_hook(lambda module, args, kwargs: seen.update(hidden=kwargs["hidden_states"]),
                                        with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(1, 97, (1, 12)))
        keys = attention.k_norm(attention.k_proj(seen["hidden"]).unflatten(-1, (2, 16)))
    expected = torch.cat([keys[0, :3], keys[0, -2:]]).mean(0)
    torch.testing.assert_close(seen["pooled"][0].double(), expected)


def test_generate_with_left_padding_matches_each_sample_alone(family):
    model = tiny_model(family).double()
    ea.attach(model, CONFIG)
    randomize_routers(model, seed=1)
    torch.manual_seed(5)
    prompts = [torch.randint(1, 97, (40,)), torch.randint(1, 97, (23,))]
    alone = []
    for prompt in prompts:
        tokens = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=12, do_sample=False)
        alone.append((tokens[0, len(prompt):], ea.routing_report(model).decisions[0]))
    batch = torch.zeros(2, 40, dtype=torch.long)
    mask = torch.zeros(2, 40, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        batch[row, 40 - len(prompt):] = prompt
        mask[row, 40 - len(prompt):] = 1
    tokens = model.generate(batch, attention_mask=mask, max_new_tokens=12, do_sample=False)
    report = ea.routing_report(model)
    for row, (expected_tokens, expected_routing) in enumerate(alone):
        assert torch.equal(tokens[row, 40:], expected_tokens)
        assert torch.equal(report.decisions[row], expected_routing)
    # The two prompts are routed differently: routing really is per input.
    assert not torch.equal(alone[0][1], alone[1][1])


def test_beam_search_keeps_each_prompts_routing():
    model = tiny_model("llama").double()
    ea.attach(model, CONFIG)
    randomize_routers(model, seed=3)
    prompt = torch.randint(1, 97, (1, 30))
    model.generate(prompt, max_new_tokens=2, do_sample=False)
    expected = ea.routing_report(model).decisions[0]
    tokens = model.generate(prompt, max_new_tokens=6, num_beams=3, do_sample=False)
    assert tokens.shape == (1, 36)
    decisions = ea.routing_report(model).decisions
    assert decisions.shape[0] == 3 and all(torch.equal(d, expected) for d in decisions)


def test_packed_sequences_match_each_sample_alone():
    model = tiny_model("qwen3").double()
    ea.attach(model, CONFIG)
    randomize_routers(model, seed=2)
    first, second = torch.randint(1, 97, (1, 30)), torch.randint(1, 97, (1, 19))
    with torch.no_grad():
        expected, routing = [], []
        for sample in (first, second):
            expected.append(model(sample).logits)
            routing.append(ea.routing_report(model).decisions[0])
        packed = torch.cat([first, second], dim=1)
        positions = torch.cat([torch.arange(30), torch.arange(19)])[None]
        logits = model(packed, position_ids=positions).logits
    torch.testing.assert_close(logits[:, :30], expected[0])
    torch.testing.assert_close(logits[:, 30:], expected[1])
    report = ea.routing_report(model)
    assert report.rows.tolist() == [0, 0]
    assert torch.equal(report.decisions[0], routing[0]) and torch.equal(report.decisions[1], routing[1])


def test_training_mode_mixes_outputs_and_only_routers_learn():
    model = tiny_model("llama")
    ea.attach(model, CONFIG)
    model.train()
    assert {name for name, p in model.named_parameters() if p.requires_grad} == {
        name for name, _ in model.named_parameters() if "elastic_router" in name
    }
    ids = torch.randint(1, 97, (2, 40))
    output = model(ids, labels=ids, elastic_noise_seed=0)
    report = ea.routing_report(model)
    loss = output.loss + report.msr.sum()
    loss.backward()
    router_grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in router_grads) and any(g.abs().sum() > 0 for g in router_grads)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    # The mixed forward equals a hard forward with the same decisions.
    decisions = report.decisions
    model.eval()
    for n in range(2):
        ea.force_routing(model, decisions[n])
        with torch.no_grad():
            torch.testing.assert_close(model(ids[n : n + 1]).logits, output.logits[n : n + 1], atol=1e-5, rtol=1e-4)


def test_detach_restores_the_model():
    model = tiny_model("mistral")
    ids = torch.randint(1, 97, (1, 20))
    with torch.no_grad():
        expected = model(ids).logits
    ea.attach(model, CONFIG)
    ea.detach(model)
    assert not ea.is_attached(model)
    assert all(p.requires_grad for p in model.parameters())
    assert not any("elastic_router" in name for name, _ in model.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected)


def test_the_frozen_output_head_reads_its_input_with_fresh_strides_until_detach():
    """``logits_to_keep`` slices the hidden states; attached (weights frozen), the head gets that slice with the
    strides of a fresh tensor, so torch folds it into one matrix product (and logits equal the plain model's)."""
    model = tiny_model("qwen2")
    ids = torch.randint(1, 97, (2, 20))
    with torch.no_grad():
        expected = model(ids, logits_to_keep=1).logits
    ea.attach(model, CONFIG)
    ea.force_routing(model, "full")
    strides = []
    spy = model.lm_head.register_forward_pre_hook(lambda module, args: strides.append(args[0].stride()))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, logits_to_keep=1).logits, expected, atol=1e-5, rtol=1e-4)
    hidden = model.config.hidden_size
    assert strides[-1] == (hidden, hidden, 1)
    ea.detach(model)
    with torch.no_grad():
        model(ids, logits_to_keep=1)
    assert strides[-1] == (20 * hidden, hidden, 1)
    spy.remove()


def test_refusals_name_the_problem():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2' is not supported"):
        ea.attach(gpt2, CONFIG)
    only_sliding = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                      head_dim=16, sliding_window=16,
                                                      layer_types=["sliding_attention"] * 2))
    with pytest.raises(UnsupportedModelError, match="every layer of this model is a sliding-window layer"):
        ea.attach(only_sliding, CONFIG)
    model = tiny_model("llama")
    with pytest.raises(ea.ConfigError, match="routed_layers"):
        ea.attach(model, ElasticConfig(block_size=8, sink_tokens=8, local_tokens=8, xa_stride=4, routed_layers=[5]))
    ea.attach(model, CONFIG)
    with pytest.raises(UnsupportedModelError, match="already attached"):
        ea.attach(model, CONFIG)
    with pytest.raises(InputError, match="batch is empty"):
        model(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(InputError, match="2D"):
        model(torch.ones(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(InputError, match="no routing report"):
        ea.routing_report(ea.attach(tiny_model("llama"), CONFIG))
    with pytest.raises(ea.NotAttachedError, match="not attached"):
        ea.routing_report(tiny_model("llama"))
    with pytest.raises(ea.NotAttachedError, match="not attached"):
        ea.save_router(tiny_model("llama"), "unused")
    assert issubclass(ea.NotAttachedError, UnsupportedModelError)  # code that caught the broader class still does


def test_short_prompts_pool_what_they_have_and_route_per_layer():
    model = tiny_model("qwen2", layers=2)
    ea.attach(model, ElasticConfig(block_size=8, sink_tokens=8, local_tokens=8, xa_stride=4))  # pools 100 + 100
    with torch.no_grad():
        logits = model(torch.randint(1, 97, (1, 3))).logits
    assert torch.isfinite(logits).all()
    assert ea.routing_report(model).z.shape == (1, 2, 2)


@pytest.mark.parametrize("configuration", ["fa-xa", "xa-ssa"])
def test_xa_configurations_run_and_report(configuration):
    model = tiny_model("llama")
    ea.attach(model, ElasticConfig(configuration=configuration, block_size=8, sink_tokens=8, local_tokens=8,
                                   xa_stride=4, xa_threshold=0.5))
    ea.force_routing(model, "sparse" if configuration == "fa-xa" else "full")
    ids = torch.randint(1, 97, (1, 64))
    with torch.no_grad():
        model(ids)
        tokens = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert tokens.shape == (1, 67)
    assert (ea.routing_report(model).esr_mean > 0).all()


def test_per_call_facts_are_forward_kwargs_of_a_prefill():
    """The same noise seed gives the same routing in train mode; another seed another draw; a decode step refuses
    the prefill's facts by name."""
    model = tiny_model("llama")
    ea.attach(model, CONFIG)
    model.train()
    ids = torch.randint(1, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    decisions = []
    for seed in (5, 5, 6):
        model(ids, elastic_noise_seed=seed)
        decisions.append(ea.routing_report(model).decisions.clone())
    assert torch.equal(decisions[0], decisions[1]) and not torch.equal(decisions[0], decisions[2])
    model.eval()
    output = model(ids, use_cache=True)
    with pytest.raises(ea.InputError, match="elastic_noise_seed apply to a prefill"):
        model(ids[:, :1], past_key_values=output.past_key_values, use_cache=True, elastic_noise_seed=5)


def test_a_prefill_inside_the_sparse_window_warns_once_and_the_report_prints_a_summary(caplog):
    """sink 8 + local 16 = 24 tokens: a 20-token prompt on SSA skips nothing (ESR 0), a 45-token one does."""
    model = tiny_model("llama")
    ea.attach(model, CONFIG)
    ea.force_routing(model, "sparse")
    for length, warned in ((20, True), (45, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="elastic_attention"), torch.no_grad():
            model.generate(torch.randint(1, 97, (2, length)), max_new_tokens=3, do_sample=False)
        notes = [record for record in caplog.records if "fit in the sparse window" in record.getMessage()]
        assert len(notes) == (1 if warned else 0)  # once per call: the prefill, not its decode steps
        if warned:
            assert notes[0].getMessage().startswith("elastic attention: 2 of 2 prompts (20 tokens at most) fit")
            assert "(sink 8 + local 16 tokens)" in notes[0].getMessage()
    ea.force_routing(model, "full")  # no head on SSA: nothing to warn about
    caplog.clear()
    with caplog.at_level("WARNING", logger="elastic_attention"), torch.no_grad():
        model(torch.randint(1, 97, (1, 20)))
    assert not [record for record in caplog.records if "sparse window" in record.getMessage()]
    printed = str(ea.routing_report(model))
    assert printed.splitlines() == ["RoutingReport: 1 sequence(s), 2 routed layer(s)",
                                    "  sequence 0 (row 0): MSR 0.00, ESR last 0.00, ESR mean 0.00"]
    assert "tensor" not in printed


def test_the_printed_report_of_a_head_set_router_names_each_sequences_set():
    from elastic_attention.integration.report import HeadSetReport, RoutingReport
    from elastic_attention.router.head_set_router import SetDecision

    decision = SetDecision(choice=torch.tensor([1, 0]), probabilities=torch.tensor([[0.2, 0.8], [0.9, 0.1]]),
                           preferred=torch.tensor([1, 0]))
    head_sets = torch.tensor([[[1.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])  # MSR 0 and 0.5 of 4 KV heads
    sets = HeadSetReport(decision=decision, head_sets=head_sets, floor_set=None, floor_confidence=0.0)
    z = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]])
    report = RoutingReport(layers=(0, 1), rows=torch.tensor([0, 1]), z=z, msr=torch.tensor([0.5, 0.0]),
                           esr_per_layer=torch.tensor([[0.25, 0.5], [0.0, 0.0]]), head_sets=sets)
    assert str(report).splitlines()[1:] == [
        "  sequence 0 (row 0): MSR 0.50, ESR last 0.50, ESR mean 0.38; head set 1 of 2: MSR 0.50, 2 of 4 KV heads "
        "full, probability 0.80",
        "  sequence 1 (row 1): MSR 0.00, ESR last 0.00, ESR mean 0.00; head set 0 of 2: MSR 0.00, 4 of 4 KV heads "
        "full, probability 0.90",
    ]
