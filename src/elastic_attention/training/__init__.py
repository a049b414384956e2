"""Router training: rows and packing, the sparsity objective, the trainer recipe, checkpoints and plots."""

from elastic_attention.training.train_config import DataConfig, TrainConfig
from elastic_attention.rows import Row, encode_row
from elastic_attention.training.data import Pack, load_rows, pack_rows
from elastic_attention.training.objective import SparsityObjective
from elastic_attention.training.trainer import RouterTrainer, train

__all__ = [
    "DataConfig",
    "Pack",
    "RouterTrainer",
    "Row",
    "SparsityObjective",
    "TrainConfig",
    "encode_row",
    "load_rows",
    "pack_rows",
    "train",
]
