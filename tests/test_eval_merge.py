"""`elastic-attention eval-merge`: eval.json files of separate calls become one table, and files that do not belong
together are refused with the reason."""

import json

import pytest

from elastic_attention.cli import main as cli_main
from elastic_attention.errors import InputError
from elastic_attention.evaluation.merge import merge_eval_documents

CONFIG = {"configuration": "fa-ssa", "sink_tokens": 128, "local_tokens": 1024}


def _row(mode, task, length, accuracy, msr, **extra):
    return {"mode": mode, "task": task, "kind": "sensitive" if task == "passkey" else "robust", "length": length,
            "samples": 2, "accuracy": accuracy, "exact_match": accuracy, "msr": msr, "esr_last": msr,
            "esr_mean": msr, "seconds": 1.0, "head_full_share": [[1.0 - msr]], **extra}


def _document(router, rows, model="m", config=CONFIG, seed=0, **extra):
    return {"command": "eval ...", "date": "2026-12-02T00:00:00+00:00", "device": "NVIDIA H200", "model": model,
            "router": router, "seed": seed, "elastic_config": config, "results": rows, **extra}


def test_cells_of_separate_calls_become_one_table(tmp_path, capsys):
    short = _document("r", [_row("full", "passkey", 8192, 1.0, 0.0), _row("elastic", "passkey", 8192, 0.5, 0.6),
                            _row("full", "recent_fact", 8192, 1.0, 0.0)])
    long = _document("r", [_row("elastic", "passkey", 32768, 0.25, 0.7, predictions=["1", "2"]),
                           _row("full", "passkey", 32768, 0.75, 0.0)], static={"static": {"msr": 0.7}})
    static = _document("another router", [_row("static", "passkey", 8192, 0.0, 0.7)])  # no elastic cells: allowed
    paths = []
    for name, document in (("short", short), ("long", long), ("static", static)):
        paths.append(tmp_path / name / "eval.json")
        paths[-1].parent.mkdir()
        paths[-1].write_text(json.dumps(document))
    # files or the folders `eval --out` wrote
    assert cli_main(["eval-merge", str(paths[0]), str(paths[1].parent), str(paths[2]), "--out",
                     str(tmp_path / "merged")]) == 0
    assert "(from 3 files)" in capsys.readouterr().out
    merged = json.loads((tmp_path / "merged" / "eval.json").read_text())
    cells = [(r["mode"], r["task"], r["length"]) for r in merged["results"]]
    assert cells == [("full", "passkey", 8192), ("full", "passkey", 32768), ("full", "recent_fact", 8192),
                     ("elastic", "passkey", 8192), ("elastic", "passkey", 32768), ("static", "passkey", 8192)]
    assert merged["results"][4]["predictions"] == ["1", "2"]  # rows are kept whole
    assert merged["router"] == "r" and merged["model"] == "m" and merged["elastic_config"] == CONFIG
    assert [source["file"] for source in merged["merged_from"]] == list(map(str, paths))
    assert merged["merged_from"][1]["static"] == {"static": {"msr": 0.7}} and merged["seed"] == 0
    table = (tmp_path / "merged" / "eval.md").read_text()
    assert "| passkey | sensitive | 32768 | 0.750 (0.00) | 0.250 (0.70) | - |" in table
    assert (tmp_path / "merged" / "accuracy_vs_msr.png").stat().st_size > 0


@pytest.mark.parametrize("documents, message", [
    ([("a", _document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])),
      ("b", _document("r", [_row("full", "passkey", 8192, 0.9, 0.0)]))], r"cell \('full', 'passkey', 8192\).*a and b"),
    ([("a", _document("r1", [_row("elastic", "passkey", 8192, 1.0, 0.6)])),
      ("b", _document("r2", [_row("elastic", "passkey", 16384, 1.0, 0.6)]))], "elastic cells of different routers"),
    ([("a", _document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])),
      ("b", _document("r", [_row("full", "passkey", 16384, 1.0, 0.0)], model="other"))], "evaluate different models"),
    ([("a", _document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])),
      ("b", _document("r", [_row("sparse", "passkey", 8192, 0.0, 1.0)], seed=1))], "different seeds"),
    ([("a", _document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])),
      ("b", _document("r", [{**_row("sparse", "passkey", 8192, 0.0, 1.0), "samples": 3}]))],
     "passkey at 8192 tokens has 2 rows in a but 3 in b"),
    ([("a", _document("r", [{key: value for key, value in _row("full", "passkey", 8192, 1.0, 0.0).items()
                             if key not in ("kind", "exact_match")}]))], "row 0 of a lacks kind, exact_match"),
    ([("a", _document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])),
      ("b", _document("r", [_row("full", "passkey", 16384, 1.0, 0.0)], config={**CONFIG, "local_tokens": 2048}))],
     "different elastic configurations"),
    ([("a", _document("r", [_row("elastic", "passkey", 8192, 1.0, 0.6)])),
      ("b", _document("r", [_row("elastic", "passkey", 16384, 1.0, 0.6)], config={**CONFIG, "router_width": 2}))],
     "elastic cells of different router settings"),
    ([("a", {"accuracy": 1.0})], "a is not an eval.json"),
    ([], "at least one"),
])
def test_files_that_do_not_belong_together_are_refused(documents, message):
    with pytest.raises(InputError, match=message):
        merge_eval_documents(documents)


def test_missing_broken_or_overwritten_files_are_named(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert cli_main(["eval-merge", str(tmp_path / "absent.json"), "--out", str(tmp_path)]) == 2
    assert "eval-merge: error: no eval.json at" in capsys.readouterr().err
    assert cli_main(["eval-merge", str(broken), "--out", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "eval.json").write_text(json.dumps(_document("r", [_row("full", "passkey", 8192, 1.0, 0.0)])))
    assert cli_main(["eval-merge", str(tmp_path / "eval.json"), "--out", str(tmp_path)]) == 2
    assert "would overwrite the input" in capsys.readouterr().err


def test_modes_keeps_only_those_cells_and_names_what_is_missing(tmp_path, capsys):
    old = _document("old router", [_row("full", "passkey", 8192, 1.0, 0.0), _row("elastic", "passkey", 8192, 0.5, 0.6),
                                   _row("sparse", "passkey", 8192, 0.0, 1.0)])
    new = _document("new router", [_row("elastic", "passkey", 8192, 0.75, 0.5)])
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    # the old router's elastic cell is dropped, so the routers no longer clash
    assert cli_main(["eval-merge", str(tmp_path / "old.json"), "--modes", "full,sparse",
                     "--out", str(tmp_path / "kept")]) == 0
    kept = json.loads((tmp_path / "kept" / "eval.json").read_text())
    assert [(r["mode"], r["accuracy"]) for r in kept["results"]] == [("full", 1.0), ("sparse", 0.0)]
    assert kept["router"] is None
    assert cli_main(["eval-merge", str(tmp_path / "kept"), str(tmp_path / "new.json"),
                     "--out", str(tmp_path / "both")]) == 0
    both = json.loads((tmp_path / "both" / "eval.json").read_text())
    assert [(r["mode"], r["accuracy"]) for r in both["results"]] == [("full", 1.0), ("sparse", 0.0), ("elastic", 0.75)]
    assert both["router"] == "new router"
    assert both["merged_from"][0]["merged_from"][0]["router"] == "old router"  # provenance stays nested
    capsys.readouterr()
    with pytest.raises(InputError, match="new.json has no cells of the modes full: leave it out"):
        merge_eval_documents([("old.json", old), ("new.json", new)], ["full"])
    with pytest.raises(InputError, match="no file has cells of the modes static: check the names.*elastic, full"):
        merge_eval_documents([("old.json", old)], ["full", "static", "elastic"])


def test_router_settings_may_differ_from_cells_that_need_no_router():
    """Full and all-SSA cells attached with a training config join a head-set router's cells: the router's own
    fields (pooling, width, head_set_choices) do not change them; the attention settings must still agree."""
    dense = _document(None, [_row("full", "passkey", 8192, 1.0, 0.0), _row("sparse", "passkey", 8192, 0.0, 1.0)],
                      config={**CONFIG, "router_width": 4})
    router_config = {**CONFIG, "router_width": 4, "head_set_choices": 5}
    routed = _document("r", [_row("elastic", "passkey", 8192, 1.0, 0.5)], config=router_config)
    merged = merge_eval_documents([("dense", dense), ("routed", routed)])
    assert merged["elastic_config"] == router_config  # the elastic cells' settings
    assert [row["mode"] for row in merged["results"]] == ["full", "sparse", "elastic"]
    moved = _document("r", [_row("elastic", "passkey", 8192, 1.0, 0.5)], config={**router_config, "sink_tokens": 0})
    with pytest.raises(InputError, match="different elastic configurations"):
        merge_eval_documents([("dense", dense), ("routed", moved)])


def test_a_file_written_before_the_signal_fields_merges_with_one_written_after():
    """Oracle: the two configurations are the same once the missing fields take their defaults."""
    from elastic_attention import ElasticConfig
    from elastic_attention.evaluation.merge import _without_router_fields

    new = ElasticConfig(block_size=64, sink_tokens=64, local_tokens=512).to_dict()
    old = {key: value for key, value in new.items() if not key.startswith("signal_")}
    assert _without_router_fields(old) == _without_router_fields(new)
    other = {**old, "local_tokens": 1024}
    assert _without_router_fields(other) != _without_router_fields(new)
