"""kv_connector_extra_config validation: unknown keys and bad values are errors naming the key."""

import pytest

from ascend_kv_transfer.options import MooncakeOptions, OffloadOptions, OptionError, parse_options


def test_defaults_and_coercion():
    opts = parse_options(MooncakeOptions, {"side_channel_port": 40000, "abort_timeout_s": 3})
    assert opts.side_channel_port == 40000
    assert opts.abort_timeout_s == 3.0 and isinstance(opts.abort_timeout_s, float)
    assert parse_options(MooncakeOptions, None) == MooncakeOptions()


@pytest.mark.parametrize(("extra", "key"), [
    ({"abort_timout_s": 1}, "abort_timout_s"),
    ({"side_channel_port": "30000"}, "side_channel_port"),
    ({"side_channel_port": 70000}, "side_channel_port"),
    ({"abort_timeout_s": 0}, "abort_timeout_s"),
    ({"protocol": "udp"}, "protocol"),
    ({"max_batch_entries": 2000}, "max_batch_entries"),
    ({"max_batch_entries": True}, "max_batch_entries"),
])
def test_bad_values_name_the_key(extra, key):
    with pytest.raises(OptionError, match=key):
        parse_options(MooncakeOptions, extra)


def test_offload_budget():
    assert parse_options(OffloadOptions, {"host_bytes": 1 << 20}).host_bytes == 1 << 20
    with pytest.raises(OptionError, match="host_bytes"):
        parse_options(OffloadOptions, {"host_bytes": -1})
    with pytest.raises(OptionError, match="side_channel_port"):
        parse_options(OffloadOptions, {"side_channel_port": 1})


def test_ignored_keys_pass_through():
    assert parse_options(OffloadOptions, {"num_workers": 3}, ignore=("num_workers",)) == OffloadOptions()
