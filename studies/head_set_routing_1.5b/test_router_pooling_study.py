"""router_pooling_study.py: a row's pooled layer-0 keys for any spans, from one short forward per spans, and a
fit per spans whose choices `studies/head_set_routing_1.5b/row_outcomes.py --predict` reads."""

import json

import pytest
import torch

import router_pooling_study


@pytest.fixture(scope="module")
def tiny():
    from elastic_attention.assets import TINY_BACKBONE
    from elastic_attention.evaluation.pipeline import load_backbone

    return load_backbone(TINY_BACKBONE, "cpu")


@pytest.mark.parametrize("spans", [[(5, 3)], [(0, 7), (11, 0), (2, 9)]])
def test_span_inputs_are_what_a_router_pooling_those_spans_reads_of_the_whole_prompt(tiny, spans):
    """Oracle: the model attached with each pair of spans as its router's pooling, run on the whole prompt (37
    tokens, longer than any pair) and read at the router."""
    import elastic_attention as ea
    from elastic_attention.integration.routing import read_router_input

    script = router_pooling_study
    model, _ = tiny
    prompt = torch.randint(0, model.config.vocab_size, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    widest = (max(first for first, _ in spans), max(last for _, last in spans))
    ea.attach(model, ea.ElasticConfig(routed_layers=(0,), pool_first=widest[0], pool_last=widest[1]),
              backend="reference")
    try:
        (router,) = ea.routers_of(model).values()
        studied = script.span_inputs(model, router, prompt, spans)
    finally:
        ea.detach(model)
    for index, (first, last) in enumerate(spans):
        ea.attach(model, ea.ElasticConfig(routed_layers=(0,), pool_first=first, pool_last=last), backend="reference")
        try:
            (router,) = ea.routers_of(model).values()
            whole = read_router_input(router, lambda: model(input_ids=torch.tensor([prompt]), use_cache=False))
        finally:
            ea.detach(model)
        torch.testing.assert_close(studied[index], whole[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shorter than the spans"):
        ea.attach(model, ea.ElasticConfig(routed_layers=(0,), pool_first=30, pool_last=10), backend="reference")
        try:
            script.span_inputs(model, ea.routers_of(model)[0], prompt, [(30, 10)])
        finally:
            ea.detach(model)


def test_each_fit_writes_choices_per_cell_with_the_sets_msrs(tmp_path, capsys):
    from elastic_attention.assets import TINY_BACKBONE

    script = router_pooling_study
    document = script.main(["--model", str(TINY_BACKBONE), "--suite", "synthetic", "--sets",
                            "needle_single=0,local_recall=1", "--set-msrs", "0,1", "--pools", "8/4,0/6",
                            "--train-lengths", "300", "--train-rows", "4", "--tasks", "needle_single,local_recall",
                            "--lengths", "300", "--rows", "3", "--steps", "5", "--predictions", str(tmp_path)])
    assert [(row["pool_first"], row["pool_last"]) for row in document["results"]] == [(8, 4), (0, 6)]
    for row in document["results"]:
        assert {key: sum(counts) for key, counts in row["rows_per_set"].items()} == {
            "needle_single@300": 3, "local_recall@300": 3}
    written = json.loads((tmp_path / "choices_0_6_seed0.json").read_text())
    assert written["set_msrs"] == [0.0, 1.0]
    assert {key: len(rows) for key, rows in written["logits"].items()} == {"needle_single@300": 3,
                                                                           "local_recall@300": 3}
    with pytest.raises(SystemExit):
        script.main(["--model", str(TINY_BACKBONE), "--suite", "synthetic", "--sets", "needle_single=2",
                     "--set-msrs", "0,1", "--pools", "8/4"])
    assert "give task=INDEX with INDEX below 2" in capsys.readouterr().err
