"""The operator's HTTP/2 requests carry header values as plain HPACK literals, with the
Authorization header still marked never-indexed (adapters/http2_headers.py)."""

from __future__ import annotations

import logging
import types

import h2.config
import h2.connection
import hpack
from hpack.struct import NeverIndexedHeaderTuple

from mtp_operator.adapters.http2_headers import plain_header_literals

TOKEN = "Bearer " + "eyJhbGciOiJSUzI1NiJ9." * 40
HEADERS = [
    (":method", "PATCH"),
    (":path", "/apis/apps/v1/namespaces/ns/deployments/pool"),
    NeverIndexedHeaderTuple("authorization", TOKEN),
]


def test_a_connection_made_after_the_change_sends_the_token_as_it_is() -> None:
    module = types.SimpleNamespace(Encoder=hpack.Encoder)
    before = module.Encoder().encode(HEADERS)
    assert TOKEN.encode() not in before  # Huffman-coded, h2's way
    assert plain_header_literals(module)
    after = module.Encoder().encode(HEADERS)
    assert TOKEN.encode() in after and len(after) > len(before)
    decoded = hpack.Decoder().decode(after)
    assert [tuple(h) for h in decoded] == [tuple(h) for h in HEADERS]
    # never-indexed, as before: no proxy may keep the token in a shared table
    assert isinstance(decoded[2], NeverIndexedHeaderTuple)
    assert plain_header_literals(module) and module.Encoder.__mro__[1] is hpack.Encoder


def test_h2s_own_connection_uses_it() -> None:
    assert plain_header_literals()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":authority", "127.0.0.1"), (":scheme", "https"), *HEADERS])
    assert TOKEN.encode() in conn.data_to_send()


def test_an_h2_without_an_encoder_is_left_alone(caplog) -> None:
    caplog.set_level(logging.WARNING)
    assert not plain_header_literals(types.SimpleNamespace())
    assert "headers left coded" in caplog.text
