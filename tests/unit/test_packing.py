import numpy as np
import pytest

from hfl.common.quantization.packing import pack, packed_nbytes, unpack, width_for


@pytest.mark.parametrize("width", range(1, 17))
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1001])
def test_round_trip_every_width_and_odd_lengths(width, count):
    rng = np.random.default_rng(width * 1000 + count)
    idx = rng.integers(0, 1 << width, size=count, dtype=np.uint32)
    if count:
        idx[0] = (1 << width) - 1  # the extreme value must survive
    data = pack(idx, width)
    assert len(data) == packed_nbytes(count, width) == -(-count * width // 8)
    assert np.array_equal(unpack(data, width, count), idx)


def test_bit_order_is_little_endian_and_dense():
    # 3-bit indices 1, 2, 7 -> bits 100 010 111 (LSB first) -> byte0 = 0b11010001, byte1 = 0b1
    assert pack(np.array([1, 2, 7]), 3) == bytes([0b11010001, 0b1])


@pytest.mark.parametrize("levels,width", [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (11, 4), (65536, 16)])
def test_width_for_levels(levels, width):
    assert width_for(levels) == width


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="width"):
        pack(np.array([1]), 0)
    with pytest.raises(ValueError, match="width"):
        pack(np.array([1]), 17)
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        pack(np.array([8]), 3)
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        pack(np.array([-1]), 3)
    with pytest.raises(ValueError, match="bytes"):
        unpack(b"\x00\x00", 3, 6)
