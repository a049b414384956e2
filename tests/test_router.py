"""The Attention Router: shape, initialisation, straight-through sampling, boundary pooling."""

import pytest
import torch

from elastic_attention.errors import InputError
from elastic_attention.patterns import SequenceLayout
from elastic_attention.router import AttentionRouter, boundary_pool, gumbel_noise, straight_through_decision


def test_router_size_and_initial_sparsity():
    router = AttentionRouter(head_dim=128, width=4)
    assert sum(p.numel() for p in router.parameters()) == 263_682  # about 0.26M per layer at head_dim 128
    torch.manual_seed(0)
    fractions = []
    for seed in range(40):
        torch.manual_seed(seed)
        router.reset_parameters()
        router.eval()
        fractions.append(router(torch.randn(64, 8, 128)).mean())
    # Across random initialisations the fraction of heads sent to full attention is about one half.
    assert 0.35 < torch.stack(fractions).mean() < 0.65


@pytest.mark.parametrize("num_kv_heads", [None, 3])
def test_initial_full_probability_sets_the_first_decisions(num_kv_heads):
    """Oracle: the frequency of full-attention samples over many Gumbel draws and inputs, against p."""
    torch.manual_seed(3)
    router = AttentionRouter(head_dim=16, width=2, num_kv_heads=num_kv_heads)
    router.set_full_probability(0.9)
    bias = router.router_mlp[-1].bias.detach().double()
    torch.testing.assert_close(torch.softmax(bias, 0)[1], torch.tensor(0.9, dtype=torch.float64))
    router.train()
    generator = torch.Generator().manual_seed(0)
    decisions = router(torch.randn(4000, 3, 16), generator=generator)
    assert abs(decisions.mean().item() - 0.9) < 0.02
    with pytest.raises(ValueError, match="probability"):
        router.set_full_probability(1.0)


def test_per_head_full_probabilities_set_each_heads_first_decisions():
    """Oracle: per KV head, the frequency of full-attention samples over many Gumbel draws and inputs, against its p."""
    torch.manual_seed(4)
    router = AttentionRouter(head_dim=16, width=2, num_kv_heads=3)
    probabilities = torch.tensor([0.9, 0.1, 0.5])
    router.set_full_probability(probabilities)
    logits = (router.router_mlp[-1].bias + router.head_bias).detach().double()
    torch.testing.assert_close(torch.softmax(logits, -1)[:, 1], probabilities.double())
    router.train()
    decisions = router(torch.randn(4000, 3, 16), generator=torch.Generator().manual_seed(0))
    assert (decisions.float().mean(0) - probabilities).abs().max() < 0.03
    router.set_full_probability(0.8)  # one number again: the per-head part is cleared
    assert not router.head_bias.any()
    with pytest.raises(ValueError, match="standardizing router"):
        AttentionRouter(head_dim=16).set_full_probability(probabilities)
    with pytest.raises(ValueError, match="one number per KV head \\(3\\), got shape \\(2,\\)"):
        router.set_full_probability(torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="must be in \\(0, 1\\)"):
        router.set_full_probability(torch.tensor([0.5, 1.0, 0.5]))


def test_pinned_heads_stay_sparse_under_noise_and_training():
    """Oracle: sample frequencies over many Gumbel draws, before and after optimizer steps that reward full
    attention on every head; the unpinned head keeps its probability and then moves, the pinned ones never leave
    sparse attention, though their logits come to favour full attention."""
    torch.manual_seed(5)
    router = AttentionRouter(head_dim=16, width=2, num_kv_heads=3)
    router.set_full_probability(torch.tensor([0.9, 0.1, 0.5]))
    router.pin_sparse(torch.tensor([False, True, True]))
    router.train()
    pooled = torch.randn(4000, 3, 16)
    decisions = router(pooled, generator=torch.Generator().manual_seed(0))
    assert abs(decisions[:, 0].mean().item() - 0.9) < 0.03 and not decisions[:, 1:].any()
    optimizer = torch.optim.AdamW(router.parameters(), lr=1e-2, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        optimizer.zero_grad()
        (-router(pooled[:256], generator=generator).sum()).backward()
        optimizer.step()
    decisions = router(pooled, generator=generator)
    assert decisions[:, 0].mean() > 0.99 and not decisions[:, 1:].any()
    logits = router.logits(pooled)
    assert (logits[:, 1:, 1] > logits[:, 1:, 0]).float().mean() > 0.5  # the pins, not the logits, keep them sparse
    assert not router.eval()(pooled)[:, 1:].any()
    assert router.state_dict()["pinned_sparse"].tolist() == [False, True, True]
    router.pin_sparse(None)
    assert router.pinned_heads() is None and "pinned_sparse" not in router.state_dict()
    assert router(pooled)[:, 1:].any()
    with pytest.raises(ValueError, match="one flag per KV head \\(3\\), got shape \\(2,\\)"):
        router.pin_sparse(torch.tensor([True, False]))
    with pytest.raises(ValueError, match="one flag per KV head \\(3\\), got shape \\(2,\\)"):
        router.pin_sparse(torch.tensor([False, False]))  # no pins, but still the wrong shape
    with pytest.raises(ValueError, match="standardizing router"):
        AttentionRouter(head_dim=16).pin_sparse(torch.tensor([True]))


def test_eval_mode_is_a_deterministic_argmax():
    router = AttentionRouter(head_dim=16).eval()
    pooled = torch.randn(5, 3, 16)
    logits = router.logits(pooled)
    decision = router(pooled)
    assert torch.equal(decision, (logits.argmax(-1) == 1).float())
    assert torch.equal(decision, router(pooled))


def test_straight_through_forward_is_one_hot_and_backward_is_the_softmax_gradient():
    torch.manual_seed(0)
    logits = torch.randn(6, 4, 2, requires_grad=True)
    noise = gumbel_noise(logits.shape, device=logits.device)
    temperature = 1.7
    z = straight_through_decision(logits, temperature, noise)
    expected_hard = ((logits + noise).argmax(-1) == 1).float()
    assert torch.equal(z.detach(), expected_hard)
    assert set(z.detach().unique().tolist()) <= {0.0, 1.0}
    upstream = torch.randn(6, 4)
    (gradient,) = torch.autograd.grad(z, logits, upstream)
    reference_logits = logits.detach().clone().requires_grad_(True)
    soft = torch.softmax((reference_logits + noise) / temperature, dim=-1)[..., 1]
    (expected,) = torch.autograd.grad(soft, reference_logits, upstream)
    torch.testing.assert_close(gradient, expected)


def test_margin_limit_clamps_the_sample_and_passes_the_gradient_through():
    """Oracle: a float64 per-element logistic on the clamped margin, with d/dmargin taken at the clamped value."""
    torch.manual_seed(1)
    logits = (torch.randn(7, 3, 2) * 50).requires_grad_(True)  # most margins far outside the limit
    noise = gumbel_noise(logits.shape, device=logits.device)
    temperature, limit = 1.3, 2.5
    z = straight_through_decision(logits, temperature, noise, margin_limit=limit)
    upstream = torch.randn(7, 3)
    (gradient,) = torch.autograd.grad(z, logits, upstream)
    for index in range(7 * 3):
        row, head = divmod(index, 3)
        margin = float(logits[row, head, 1].detach() - logits[row, head, 0].detach())
        clamped = min(max(margin, -limit), limit)
        perturbed = clamped + float(noise[row, head, 1] - noise[row, head, 0])
        assert z[row, head].item() == (1.0 if perturbed > 0 else 0.0)
        soft = 1.0 / (1.0 + torch.exp(torch.tensor(-perturbed / temperature, dtype=torch.float64)))
        slope = float(soft * (1 - soft)) / temperature * float(upstream[row, head])
        torch.testing.assert_close(gradient[row, head].double(), torch.tensor([-slope, slope], dtype=torch.float64),
                                   rtol=1e-5, atol=1e-9)
    # Without a limit the same saturated margins give a (numerically) zero gradient: what the limit is for.
    (free,) = torch.autograd.grad(straight_through_decision(logits, temperature, noise), logits, upstream)
    saturated = (logits[..., 1] - logits[..., 0]).abs() > 60
    assert saturated.any() and free[saturated].abs().max() < 1e-12


def test_standardizing_router_centres_and_scales_per_head():
    """Oracle: float64 per-head mean and RMS by explicit loops; logits = the plain MLPs on the standardized input
    plus the head bias."""
    torch.manual_seed(2)
    router = AttentionRouter(head_dim=6, width=2, num_kv_heads=3).eval()
    samples = torch.randn(9, 3, 6) * torch.tensor([1.0, 5.0, 0.2])[:, None] + torch.tensor([0.0, 10.0, -3.0])[:, None]
    router.set_feature_statistics(samples)
    for head in range(3):
        values = [[float(samples[m, head, d]) for d in range(6)] for m in range(9)]
        mean = [sum(values[m][d] for m in range(9)) / 9 for d in range(6)]
        rms = (sum((values[m][d] - mean[d]) ** 2 for m in range(9) for d in range(6)) / 54) ** 0.5
        torch.testing.assert_close(router.feature_mean[head].double(), torch.tensor(mean, dtype=torch.float64))
        assert abs(float(router.feature_scale[head]) - rms) < 1e-5 * rms
    with torch.no_grad():
        router.head_bias.copy_(torch.randn(3, 2))
    pooled = torch.randn(4, 3, 6) * 3
    plain = AttentionRouter(head_dim=6, width=2)
    plain.load_state_dict({k: v for k, v in router.state_dict().items() if "mlp" in k})
    standardized = (pooled - router.feature_mean) / router.feature_scale[:, None]
    torch.testing.assert_close(router.logits(pooled), plain.logits(standardized) + router.head_bias)
    with pytest.raises(ValueError, match="must be \\[M >= 2, 3, 6\\]"):
        router.set_feature_statistics(torch.randn(5, 2, 6))
    with pytest.raises(ValueError, match="router_standardize is off"):
        plain.set_feature_statistics(samples)


def test_training_mode_samples_with_the_generator():
    router = AttentionRouter(head_dim=8).train()
    pooled = torch.randn(200, 2, 8)
    first = router(pooled, generator=torch.Generator().manual_seed(3))
    again = router(pooled, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, again)
    assert 0.3 < first.mean() < 0.7  # near-zero logits: Gumbel noise decides


def test_boundary_pool_per_sequence():
    keys = torch.randn(2, 30, 3, 4)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0] = True
    mask[1, 23:] = True  # a left-padded prompt of 7 tokens, shorter than the 5 + 4 pooling window
    layout = SequenceLayout.from_padding_mask(mask)
    pooled = boundary_pool(keys, layout, first=5, last=4)
    expected_first = torch.cat([keys[0, :5], keys[0, 26:]]).mean(0)
    torch.testing.assert_close(pooled[0], expected_first)
    # The short prompt pools every token it has, and never a pad token.
    torch.testing.assert_close(pooled[1], keys[1, 23:].mean(0))


def test_boundary_pool_reads_only_the_prompt_of_each_packed_sample():
    keys = torch.randn(1, 20, 2, 4)
    layout = SequenceLayout.from_position_ids(torch.tensor([list(range(12)) + list(range(8))]))
    pooled = boundary_pool(keys, layout, first=2, last=3, prompt_lengths=[9, 4])
    torch.testing.assert_close(pooled[0], keys[0, [0, 1, 6, 7, 8]].mean(0))  # answer tokens 9..11 unseen
    torch.testing.assert_close(pooled[1], keys[0, 12:16].mean(0))  # a 4-token prompt: every prompt token
    for bad in ([9], [0, 4], [13, 4]):
        with pytest.raises(InputError, match="prompt_lengths must give one length"):
            boundary_pool(keys, layout, first=2, last=3, prompt_lengths=bad)


def test_boundary_pool_packed_sequences_never_mix():
    keys = torch.randn(1, 9, 2, 4)
    layout = SequenceLayout.from_position_ids(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]]))
    pooled = boundary_pool(keys, layout, first=1, last=1)
    torch.testing.assert_close(pooled[0], keys[0, [0, 3]].mean(0))
    torch.testing.assert_close(pooled[1], keys[0, [4, 8]].mean(0))
