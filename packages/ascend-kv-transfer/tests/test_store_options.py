"""KV pool options: sizes with units, Mooncake's segment minimum, addresses; bad values are errors naming the key."""

import pytest

from ascend_kv_transfer.options import OptionError
from ascend_kv_transfer.pool.options import MIN_SEGMENT_BYTES, StoreOptions, parse_size, parse_store_options


def test_defaults():
    opts = parse_store_options(None)
    assert opts == StoreOptions()
    assert opts.master_host_port == ("127.0.0.1", 50051)
    assert opts.metadata_server == "P2PHANDSHAKE" and opts.protocol == "tcp"


@pytest.mark.parametrize(("value", "expected"), [
    (1 << 30, 1 << 30), ("64MiB", 64 << 20), ("64MB", 64 << 20), ("1GB", 1 << 30), ("1.5 GiB", 3 << 29),
    ("512kb", 512 << 10), ("4096", 4096), (0, 0),
])
def test_sizes(value, expected):
    assert parse_size("global_segment_size", value) == expected


def test_sizes_in_config():
    opts = parse_store_options({"global_segment_size": "32MiB", "local_buffer_size": "1MB",
                                "master_server_address": "10.0.0.5:50088",
                                "metadata_server": "http://10.0.0.5:8080/metadata", "save_output_blocks": True})
    assert opts.global_segment_size == 32 << 20 and opts.local_buffer_size == 1 << 20
    assert opts.master_host_port == ("10.0.0.5", 50088)
    assert opts.save_output_blocks is True


@pytest.mark.parametrize(("extra", "key"), [
    ({"master_server_adress": "127.0.0.1:1"}, "master_server_adress"),
    ({"master_server_address": "127.0.0.1"}, "master_server_address"),
    ({"master_server_address": "127.0.0.1:99999"}, "master_server_address"),
    ({"master_server_address": ":50051"}, "master_server_address"),
    ({"metadata_server": "10.0.0.5:8080"}, "metadata_server"),
    ({"protocol": "udp"}, "protocol"),
    ({"global_segment_size": "lots"}, "global_segment_size"),
    ({"global_segment_size": "8MB"}, "global_segment_size"),
    ({"global_segment_size": True}, "global_segment_size"),
    ({"local_buffer_size": -1}, "local_buffer_size"),
    ({"master_connect_timeout_s": 0}, "master_connect_timeout_s"),
    ({"max_batch_transfers": 2048}, "max_batch_transfers"),
    ({"save_output_blocks": "yes"}, "save_output_blocks"),
    ({"local_hostname": ""}, "local_hostname"),
])
def test_bad_values_name_the_key(extra, key):
    with pytest.raises(OptionError, match=key):
        parse_store_options(extra)


def test_segment_minimum_is_explained():
    with pytest.raises(OptionError, match="16 MiB"):
        parse_store_options({"global_segment_size": MIN_SEGMENT_BYTES - 1})
    assert parse_store_options({"global_segment_size": MIN_SEGMENT_BYTES}).global_segment_size == MIN_SEGMENT_BYTES
    assert parse_store_options({"global_segment_size": 0}).global_segment_size == 0
