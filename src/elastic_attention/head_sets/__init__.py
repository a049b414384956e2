"""Head sets: fixed choices of full-attention KV heads, the files that hold them, and the greedy search that finds
them.

- `files`: the head-set file format and `HeadSets` (its kept sets and the search's path; ``heads@M`` is the path's
  point at MSR M), read by training (``initial_full_heads``) and by `elastic-attention eval --modes heads`.
- `search`: the greedy search (`greedy_prune`) and the ``elastic-attention search-heads`` command (`run_search`).

Only `files` is imported here: the search needs the evaluation and training code, which import this package.
"""

from elastic_attention.head_sets.files import HeadSets, load_head_set, read_head_sets, split_set_reference

__all__ = ["HeadSets", "load_head_set", "read_head_sets", "split_set_reference"]
