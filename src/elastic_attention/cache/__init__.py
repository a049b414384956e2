"""KV caches for elastic attention: `ElasticCache` keeps per head only what that head reads again."""

from elastic_attention.cache.bounded import ElasticCache, cache_nbytes
from elastic_attention.cache.layer import ElasticCacheLayer

__all__ = ["ElasticCache", "ElasticCacheLayer", "cache_nbytes"]
