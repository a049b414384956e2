"""Training: the router trainer (rows and packing, the sparsity objective, the recipe, checkpoints and plots) and
the backbone pretraining recipe (`PretrainRecipe`; the whole run: `elastic_attention.training.pretrain.pretrain`)."""

from elastic_attention.training.pretrain import PretrainRecipe
from elastic_attention.training.pretrain_config import PretrainConfig
from elastic_attention.training.train_config import DataConfig, TrainConfig
from elastic_attention.rows import Row, encode_row
from elastic_attention.training.data import Pack, load_rows, pack_rows
from elastic_attention.training.objective import SparsityObjective
from elastic_attention.training.trainer import RouterTrainer, train

__all__ = [
    "DataConfig",
    "Pack",
    "PretrainConfig",
    "PretrainRecipe",
    "RouterTrainer",
    "Row",
    "SparsityObjective",
    "TrainConfig",
    "encode_row",
    "load_rows",
    "pack_rows",
    "train",
]
