"""KV caches for elastic attention: `ElasticCache` keeps per head only what that head reads again."""

from elastic_attention.cache.bounded import ElasticCache, ElasticCacheLayer, cache_nbytes

__all__ = ["ElasticCache", "ElasticCacheLayer", "cache_nbytes"]
