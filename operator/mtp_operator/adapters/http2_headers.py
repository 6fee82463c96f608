"""Request headers sent as plain literals over HTTP/2 (the operator's one API connection).

HPACK may send a header value Huffman-coded or as it is; h2 codes every value. The
Authorization header (a ServiceAccount token, ~1 KB) is marked never-indexed, as it should
be, so it is coded afresh on every request: in pure Python that was ~0.2 ms a request, a
few CPU-seconds of a 1,000-resource rollout's ~8,000 requests. Sent as plain literals the
headers take ~25% more bytes (~200 a request, on a connection to the API server) and no
coding; the never-indexed marking, and so the token's protection, is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

PATCHED = "_mtp_operator_plain"


def plain_header_literals(connection_module: Any = None) -> bool:
    """Make the HPACK encoder of every h2 connection made from now on send plain literals;
    True when in place. An h2 whose connection module does not build its encoder from
    hpack's Encoder is left alone, with a warning (requests then cost a little more CPU)."""
    if connection_module is None:
        try:
            import h2.connection as connection_module
        except ImportError:
            log.warning("http2_headers: h2 is not installed; headers left as h2 codes them")
            return False
    base = getattr(connection_module, "Encoder", None)
    if base is not None and getattr(base, PATCHED, False):
        return True
    if base is None or not callable(getattr(base, "encode", None)):
        log.warning("http2_headers: h2.connection has no hpack Encoder; headers left coded")
        return False

    class PlainLiteralEncoder(base):  # type: ignore[misc, valid-type]
        def encode(self, headers: Any, huffman: bool = False) -> bytes:
            return super().encode(headers, huffman=False)

    setattr(PlainLiteralEncoder, PATCHED, True)
    connection_module.Encoder = PlainLiteralEncoder
    return True
