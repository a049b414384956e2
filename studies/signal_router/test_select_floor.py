"""select_floor against cells worked out by hand: the sparsest passing candidate, a weak cell vetoing, none passing."""

from select_floor import cell_means, choose_floor


def _cells():
    scores = {  # (task, length, row) -> mode -> score; three rows in a, two in b, c below the full-attention floor
        ("a", 8192, 0): {"full": 1.0, "heads@0.3": 1.0, "heads@0.5": 1.0},
        ("a", 8192, 1): {"full": 1.0, "heads@0.3": 1.0, "heads@0.5": 0.0},
        ("a", 8192, 2): {"full": 1.0, "heads@0.3": 1.0, "heads@0.5": 1.0},
        ("b", 16384, 0): {"full": 1.0, "heads@0.3": 1.0, "heads@0.5": 1.0},
        ("b", 16384, 1): {"full": 0.5, "heads@0.3": 0.5, "heads@0.5": 0.5},
        ("c", 8192, 0): {"full": 0.2, "heads@0.3": 0.0, "heads@0.5": 0.0},
    }
    return cell_means(scores)


def test_the_sparsest_candidate_that_keeps_every_counted_cell():
    cells = _cells()
    assert cells[("a", 8192)] == {"full": 1.0, "heads@0.3": 1.0, "heads@0.5": 2 / 3}
    result = choose_floor(cells, [0.5, 0.3], floor_full=0.5, mean_bar=0.97, cell_bar=0.9)
    assert result["chosen_msr"] == 0.3 and not result["none_passed"]
    at_half = result["candidates"][1]
    assert at_half["msr"] == 0.5 and at_half["cells"] == 2  # c is not counted (full 0.2)
    assert abs(at_half["mean_retention"] - (2 / 3 + 1.0) / 2) < 1e-12 and at_half["worst_cell"] == "a@8192"
    # a looser cell bar and mean let the sparser point through
    assert choose_floor(cells, [0.3, 0.5], 0.5, 0.8, 0.6)["chosen_msr"] == 0.5


def test_the_densest_candidate_flagged_when_none_passes():
    result = choose_floor(_cells(), [0.3, 0.5], 0.5, 1.01, 0.9)
    assert result["chosen_msr"] == 0.3 and result["none_passed"]
