"""head_set_choices.py: the sets it reads are the ones the model routes with, the price it fits is the
smallest a scan of prices finds, and the adapter it writes routes as the priced choices say."""

import json

import pytest
import torch

import head_set_choices


def test_the_fitted_price_is_the_smallest_that_sends_every_sensitive_row_to_the_fullest_set():
    """Oracle: a scan of prices in steps of 1e-3 for the first at which every row's argmax of logit - price * msr is
    the lowest-MSR set."""
    script = head_set_choices
    generator = torch.Generator().manual_seed(0)
    msrs = torch.tensor([0.7, 0.25, 1.0, 0.5], dtype=torch.float64)  # the fullest set is not the first
    for _ in range(5):
        logits = torch.randn(12, 4, generator=generator, dtype=torch.float64) * 2
        price = script.fit_price(logits, msrs, margin=0.0)
        prices = torch.arange(0, 40, 1e-3, dtype=torch.float64)
        ok = [bool((script.choices(logits, msrs, float(p)) == 1).all()) for p in prices]
        first = float(prices[ok.index(True)])
        assert first - 1e-3 <= price <= first + 1e-9
        assert (script.choices(logits, msrs, price + 1e-6) == 1).all()
        assert script.fit_price(logits, msrs, margin=0.25) == price + 0.25
    assert script.fit_price(torch.tensor([[5.0, 9.0, 0.0, 1.0]], dtype=torch.float64), msrs, 0.0) == 0.0


@pytest.mark.slow  # a study's script end to end on a model: make test-slow and CI run it
def test_choices_match_the_models_routing_and_the_written_adapter_routes_as_priced(tmp_path):
    import elastic_attention as ea
    from elastic_attention.assets import TINY_BACKBONE
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.rows import encode_row

    model, tokenizer = load_backbone(TINY_BACKBONE, "cpu")
    shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=128, xa_stride=8, head_set_choices=3))
    (router,) = ea.routers_of(model).values()
    half = torch.zeros(shape, dtype=torch.bool)
    half[::2] = True
    router.set_head_sets(torch.stack([torch.zeros(shape, dtype=torch.bool), torch.ones(shape, dtype=torch.bool), half]))
    script = head_set_choices
    tasks = ["needle_single", "local_recall"]
    torch.manual_seed(3)
    with torch.no_grad():  # random weights, then each set's mean logit over the rows removed: the choices spread
        for parameter in router.parameters():
            parameter.normal_(0, 0.5)
        logits = torch.cat([script.choice_logits(model, router, tokenizer, task, 600, 6, seed)
                            for task in tasks for seed in (0, 7)])
        router.router_mlp[-1].bias -= logits.mean(dim=0).to(torch.float32)
    ea.save_router(model, tmp_path / "adapter")
    ea.detach(model)

    document = script.main(["--model", str(TINY_BACKBONE), "--router", str(tmp_path / "adapter"), "--suite",
                            "synthetic", "--tasks", ",".join(tasks), "--lengths", "600", "--rows", "6",
                            "--calibrate-tasks", ",".join(tasks), "--calibrate-lengths", "600", "--calibrate-rows", "6",
                            "--calibrate-seed", "7", "--price-margin", "0.1", "--device", "cpu",
                            "--write-adapter", str(tmp_path / "priced"), "--out", str(tmp_path / "choices.json")])
    assert json.loads((tmp_path / "choices.json").read_text())["price"] == document["price"]
    assert document["set_msrs"] == [1.0, 0.0, 0.5]

    def routed_msrs(adapter, task):
        """Each evaluation row's MSR when the model routes it with ``adapter`` (a whole forward)."""
        model, _ = load_backbone(TINY_BACKBONE, "cpu")
        ea.load_router(model, adapter, backend="reference")
        msrs = []
        for row in suite_of(task).generate(task, 600, 0, 6, tokenizer):
            with torch.no_grad():
                model(input_ids=torch.tensor([encode_row(tokenizer, row).prompt_ids]))
            msrs.append(float(ea.routing_report(model).msr[0]))
        return msrs

    msrs = torch.tensor(document["set_msrs"], dtype=torch.float64)
    chosen_sets = set()
    for record in document["results"]:
        logits = torch.tensor(document["logits"][f"{record['task']}@600"], dtype=torch.float64)
        argmax, priced = script.choices(logits, msrs, 0.0), script.choices(logits, msrs, document["price"])
        chosen_sets |= set(argmax.tolist())
        assert routed_msrs(tmp_path / "adapter", record["task"]) == msrs[argmax].tolist()
        assert routed_msrs(tmp_path / "priced", record["task"]) == msrs[priced].tolist()
        assert abs(record["priced"]["msr"] - float(msrs[priced].mean())) < 1e-12
        if record["kind"] == "sensitive":  # the calibration rows are other rows: the price need not cover these
            assert record["priced"]["msr"] <= record["argmax"]["msr"]
    assert len(chosen_sets) >= 2  # the rows do not all choose alike
    calibration = [record for record in document["calibration"] if record["kind"] == "sensitive"]
    assert calibration and all(record["priced"]["share_per_set"]["0.000"] == 1.0 for record in calibration)


def test_sets_of_the_same_msr_keep_their_own_shares():
    """Oracle: rows counted by hand; two sets at MSR 0.5 (from two search files) are told apart by index."""
    script = head_set_choices
    msrs = torch.tensor([0.5, 1.0, 0.5], dtype=torch.float64)
    assert script.set_labels(msrs) == ["0.500 #0", "1.000", "0.500 #2"]
    logits = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 0, 1.0], [0, 1.0, 0]], dtype=torch.float64)
    record = script.summary("multikey", "sensitive", 8192, logits, msrs, price=0.0)
    assert record["argmax"]["share_per_set"] == {"0.500 #0": 0.25, "1.000": 0.25, "0.500 #2": 0.5}
    assert record["argmax"]["msr"] == 0.625



#: float32 ulps of a logit's scale two calls may differ by (one was seen: 13486.2666 against 13486.2656)
LOGIT_ULPS = 8


def assert_same_logits(actual: dict, expected: dict) -> None:
    """Each call computes the prompts' pooled keys in forwards of its own, and on a CPU their float32 sums over the
    pooled tokens may run in another order (MKL and oneDNN pick kernels by buffer alignment and thread count): the
    logits agree to a few float32 ulps of their cell's largest magnitude, not bit for bit."""
    assert actual.keys() == expected.keys()
    for cell, values in expected.items():
        want = torch.tensor(values, dtype=torch.float64)
        scale = LOGIT_ULPS * torch.finfo(torch.float32).eps * float(want.abs().max())
        torch.testing.assert_close(torch.tensor(actual[cell], dtype=torch.float64), want, rtol=0, atol=scale)


def test_kept_router_inputs_give_the_logits_the_prompts_give(tmp_path, monkeypatch):
    """Oracle: the logits of a call that computes every prompt's pooled keys. A second call reading the kept file
    gives the same logits without running the model up to the router; a file kept for another layer is refused."""
    import elastic_attention as ea
    from elastic_attention.assets import TINY_BACKBONE
    from elastic_attention.evaluation.pipeline import load_backbone

    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=128, xa_stride=8, head_set_choices=2))
    torch.manual_seed(5)
    with torch.no_grad():
        for parameter in ea.routers_of(model)[0].parameters():
            parameter.normal_(0, 0.5)
    ea.save_router(model, tmp_path / "adapter")
    script = head_set_choices
    arguments = ["--model", str(TINY_BACKBONE), "--router", str(tmp_path / "adapter"), "--suite", "synthetic",
                 "--tasks", "needle_single,local_recall", "--lengths", "500", "--rows", "3", "--device", "cpu"]
    computed = script.main(arguments)
    kept = script.main([*arguments, "--inputs", str(tmp_path / "inputs.safetensors")])
    assert_same_logits(kept["logits"], computed["logits"])

    def refuse(*args, **kwargs):
        raise AssertionError("the kept file holds these rows: nothing is computed")

    monkeypatch.setattr(script, "pooled_router_input", refuse)
    written = (tmp_path / "inputs.safetensors").stat().st_mtime_ns
    again = script.main([*arguments, "--inputs", str(tmp_path / "inputs.safetensors")])
    assert_same_logits(again["logits"], computed["logits"])
    assert (tmp_path / "inputs.safetensors").stat().st_mtime_ns == written  # nothing new: the file is not rewritten
    written_with = script.inputs_metadata(str(TINY_BACKBONE), 0, torch.float32, (100, 100))
    assert script.read_inputs(tmp_path / "inputs.safetensors", written_with)  # the control
    for other in (script.inputs_metadata(str(TINY_BACKBONE), 1, torch.float32, (100, 100)),
                  script.inputs_metadata(str(TINY_BACKBONE), 0, torch.float32, (50, 30))):
        with pytest.raises(SystemExit, match="not"):
            script.read_inputs(tmp_path / "inputs.safetensors", other)
