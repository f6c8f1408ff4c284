"""config.client_address: the client behind N trusted proxies, never an address the client wrote."""

from __future__ import annotations

import pytest

from config.client_address import client_address

PEER = "10.0.0.2"


@pytest.mark.parametrize(
    ("hops", "forwarded", "expected"),
    [
        (0, "198.51.100.1", PEER),  # no proxy trusted: the header is the client's own text
        (1, None, PEER),
        (1, "198.51.100.1", "198.51.100.1"),
        (1, "6.6.6.6, 7.7.7.7,198.51.100.1", "198.51.100.1"),  # spoofed left-most entries
        (2, "6.6.6.6, 198.51.100.1, 10.0.0.9", "198.51.100.1"),
        (3, "198.51.100.1, 10.0.0.9", "198.51.100.1"),  # fewer entries than hops: the left-most
        (1, "2001:db8::1", "2001:db8::1"),
        (1, "[2001:db8::1]:4711", "2001:db8::1"),
        (1, "198.51.100.1:4711", "198.51.100.1"),
        (1, "not-an-address", PEER),
        (1, "6.6.6.6, unknown", PEER),
        (1, " , ", PEER),
    ],
)
def test_the_client_is_read_hops_entries_from_the_right(hops, forwarded, expected):
    meta = {"REMOTE_ADDR": PEER}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(meta, hops=hops) == expected
