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


@pytest.mark.parametrize("width", range(1, 9))
def test_the_word_path_is_the_bit_stream(width):
    """Widths <= 8 pack eight indices into one 64-bit word: the same bytes as the bit-by-bit stream (index k at bits
    [k width, (k + 1) width), least significant first), and unpack reads them back, for lengths around a word."""
    rng = np.random.default_rng(width)
    for count in (1, 5, 8, 13, 16, 4099):
        idx = rng.integers(0, 1 << width, size=count, dtype=np.uint32)
        bits = ((idx[:, None] >> np.arange(width, dtype=np.uint32)) & 1).astype(np.uint8).ravel()
        assert pack(idx, width) == np.packbits(bits, bitorder="little").tobytes()
        assert unpack(pack(idx, width), width, count).dtype == np.uint32


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
