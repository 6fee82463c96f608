"""Listen addresses given on the command line."""

from __future__ import annotations


def parse_address(address: str) -> tuple[str | None, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (every interface) → (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not HOST:PORT")
    host = host.strip("[]")
    return (host or None), int(port)
