"""The Attention Router, its pooling and its straight-through sampling. Torch only."""

from elastic_attention.router.head_set_router import HeadSetRouter
from elastic_attention.router.pooling import boundary_pool
from elastic_attention.router.router import AttentionRouter
from elastic_attention.router.sampling import gumbel_noise, is_retrieval, straight_through_decision
from elastic_attention.router.temperature import TemperatureSchedule

__all__ = [
    "AttentionRouter",
    "HeadSetRouter",
    "TemperatureSchedule",
    "boundary_pool",
    "gumbel_noise",
    "is_retrieval",
    "straight_through_decision",
]
