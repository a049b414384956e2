import pytest

from elastic_attention import ConfigError, ElasticConfig


def test_defaults_follow_the_paper():
    config = ElasticConfig()
    assert (config.sink_tokens, config.local_tokens, config.block_size) == (128, 2048, 128)
    assert (config.xa_stride, config.xa_threshold) == (16, 0.9)
    assert (config.pool_first, config.pool_last, config.router_width) == (100, 100, 4)
    assert (config.retrieval_mode, config.sparse_mode) == ("full", "ssa")
    assert ElasticConfig(configuration="xa-ssa").retrieval_mode == "xa"


def test_json_round_trip(tmp_path):
    config = ElasticConfig(configuration="fa-xa", block_size=64, sink_tokens=64, local_tokens=256, routed_layers=[3, 1])
    assert config.routed_layers == (1, 3)
    again = ElasticConfig.from_json(config.to_json())
    assert again == config
    path = tmp_path / "c.json"
    path.write_text(config.to_json())
    assert ElasticConfig.load(path) == config
    assert config.to_dict()["format_version"] == 1


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"configuration": "ssa-fa"}, "`configuration`"),
        ({"sink_tokens": 100}, "`sink_tokens` must be a multiple of `block_size` (128), got 100"),
        ({"local_tokens": 200}, "`local_tokens`"),
        ({"local_tokens": 0}, "`local_tokens` must be at least 128"),
        ({"block_size": 0}, "`block_size`"),
        ({"xa_stride": 12}, "`xa_stride` must divide `block_size` (128), got 12"),
        ({"xa_threshold": 0.0}, "`xa_threshold`"),
        ({"xa_threshold": 1.5}, "`xa_threshold`"),
        ({"pool_first": -1}, "`pool_first`"),
        ({"pool_first": 0, "pool_last": 0}, "`pool_first` + `pool_last`"),
        ({"router_width": 0}, "`router_width`"),
        ({"routed_layers": [1, 1]}, "`routed_layers`"),
        ({"routed_layers": []}, "`routed_layers`"),
        ({"block_size": 1.5}, "`block_size` must be an integer"),
    ],
)
def test_invalid_fields_are_named(kwargs, words):
    with pytest.raises(ConfigError) as error:
        ElasticConfig(**kwargs)
    assert words in str(error.value)


def test_json_refuses_unknown_fields_and_versions():
    data = ElasticConfig().to_dict()
    with pytest.raises(ConfigError, match="unknown elastic config fields"):
        ElasticConfig.from_dict({**data, "sinks": 3})
    with pytest.raises(ConfigError, match="format_version"):
        ElasticConfig.from_dict({**data, "format_version": 99})
    with pytest.raises(ConfigError, match="not valid JSON"):
        ElasticConfig.from_json("{")
