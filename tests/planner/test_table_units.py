"""The plan table's sizes in units that show them, as its times are: a tiny model's memory per device once
printed 0.000 (GiB), its bytes sent 0.0001 (GB) (issue 70)."""

import pytest

from hetrain.planner import api
from hetrain.planner.units import size

UNITS = ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "kB", "B")


def test_a_size_takes_the_largest_unit_it_reaches_with_four_digits():
    assert [size(n) for n in (0, 1536, 1.076 * 2**30, 300 * 2**20, 5e12)] == \
        ["0 B", "1.5 KiB", "1.076 GiB", "300 MiB", "4.547 TiB"]
    assert [size(n, binary=False) for n in (505e6, 67_400, 999, 3.874e9)] == ["505 MB", "67.4 kB", "999 B", "3.874 GB"]


@pytest.mark.parametrize("model, batch, devices", [("lenet", 8, "a100:4"), ("vgg16", 256, "tpu-v3:4,tpu-v2:4")])
def test_memory_and_bytes_sent_show_their_digits_for_a_tiny_model_and_a_large_one(model, batch, devices):
    text = api.plan_model(model, batch, devices).table()
    rows = [line.split() for line in text.splitlines()
            if line.startswith(("plan ", "data-parallel", "one-weird-trick", "hypar"))]
    assert len(rows) == 4 and "0.000" not in text, text
    for row in rows:
        sizes = row[7:11]  # after the name and three times (a number and its unit each): bytes sent, memory
        assert all(float(number) > 0 and unit in UNITS for number, unit in zip(sizes[::2], sizes[1::2])), row
