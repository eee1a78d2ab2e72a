import pytest

from autofit.errors import UsageError
from autofit.units import format_duration, format_size, parse_count, parse_duration, parse_size


@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000), ("4096", 4096), ("1 gib", 2**30),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "two gigs", "2XB", "-1GiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="memory size"):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [("20m", 1200), ("1h30m", 5400), ("90s", 90), ("45", 45), ("1.5m", 90)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "soon", "10x", "0s", "m"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


def test_format():
    assert format_size(3 * 2**30) == "3.00 GiB"
    assert format_size(None) == "-"
    assert format_duration(3725) == "1h02m"
    assert format_duration(75) == "1m15s"


@pytest.mark.parametrize("text,expected", [("10B", 10e9), ("500M", 5e8), ("1.5T", 1.5e12), ("2e9", 2e9),
                                           ("64k", 64e3), ("1000", 1000.0)])
def test_parse_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["10 GB", "ten", "0", "-5B", ""])
def test_parse_count_rejects(text):
    with pytest.raises(UsageError, match="A count must"):
        parse_count(text)
