import pytest

from simulator.base.units import (
    UnitError,
    format_bytes,
    format_time,
    parse_bandwidth,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("200 Gb/s", 25e9),
    ("200Gb/s", 25e9),
    ("200 Gbps", 25e9),
    ("25 GB/s", 25e9),
    ("300 GB/s", 300e9),
    ("400 Gb/s", 50e9),
    ("1 GiB/s", 2.0**30),
    ("1.5 TB/s", 1.5e12),
    ("8 b/s", 1.0),
    ("1e3 MB/s", 1e9),
])
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("25 MB", 25e6),
    ("80 GiB", 80 * 2.0**30),
    ("1 KiB", 1024.0),
    ("1 kB", 1000.0),
    ("512 B", 512.0),
    ("8 Gb", 1e9),
    ("0.5 TB", 5e11),
])
def test_size(text, expected):
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("1 us", 1e-6), ("1.5 us", 1.5e-6), ("1.5µs", 1.5e-6), ("2 ms", 2e-3), ("3 s", 3.0),
    ("700 ns", 7e-7), ("1 min", 60.0),
])
def test_time(text, expected):
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize(("parser", "value"), [
    (parse_bandwidth, "25 GB"),  # a size is not a bandwidth
    (parse_bandwidth, 25e9),  # bare numbers are never guessed
    (parse_bandwidth, "fast"),
    (parse_size, "25 MB/s"),
    (parse_size, "25"),
    (parse_size, True),
    (parse_time, "1 parsec"),
    (parse_time, "5"),
])
def test_rejects(parser, value):
    with pytest.raises(UnitError, match="e.g."):
        parser(value)


def test_bits_and_bytes_differ_by_eight():
    assert parse_bandwidth("100 GB/s") == 8 * parse_bandwidth("100 Gb/s")


def test_formatting():
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(12) == "12 B"
    assert format_time(0.25) == "250.000 ms"
    assert format_time(3e-9) == "3.0 ns"
