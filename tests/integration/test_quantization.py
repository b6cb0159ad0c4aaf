"""Quantized runs of paper 001 on real processes: QHetFed (s1 = 4, s2 = 10) and Hier-Local-QSGD learn, the bytes
on the wire are the codecs' packed sizes, and latency.auto_tau_gamma picks (tau, gamma) every round."""
import pytest

from hfl.common.quantization import latency_opt as lo
from hfl.common.wire import CODECS

from .conftest import SMALL

S1, S2 = 4, 10
QSGD = ["pipeline.uplink_encoding=qsgd", "pipeline.backhaul_encoding=qsgd",
        f"pipeline.params.uplink_encoding.levels={S1}", f"pipeline.params.backhaul_encoding.levels={S2}"]
DEVICES, EDGES = 6, 2  # SMALL: 2 edges x 3 devices
# Every upload is one Envelope: the packed tensor (header + indices) plus meta, transforms and scalars. That
# envelope overhead was ~270 B per message when measured (float doubles and ids); 512 B bounds it.
ENVELOPE_OVERHEAD = 512


def packed_bytes(dim: int, device_uploads: int) -> int:
    """Bytes of one round's tensors: `device_uploads` Q1 messages per device and one Q2 message per edge, each
    sized by the codec's own size function."""
    qsgd = CODECS.get("qsgd")
    return (DEVICES * device_uploads * qsgd.bits(dim, levels=S1) + EDGES * qsgd.bits(dim, levels=S2)) // 8


def assert_packed(rows, dim, device_uploads: list[int]):
    for row, uploads in zip(rows, device_uploads, strict=True):
        expected = packed_bytes(dim, uploads)
        messages = DEVICES * uploads + EDGES
        assert expected <= row["bytes_up"] <= expected + messages * ENVELOPE_OVERHEAD, (row["round"], row["bytes_up"],
                                                                                        expected)
        assert row["bytes_up"] <= 1.05 * expected  # the 5% bound on packed size + header


@pytest.mark.parametrize("algorithm, tau, gamma, uploads", [
    ("qhetfed", 2, 5, 3),          # tau gradient uploads + 1 model delta per device
    ("hier-local-qsgd", 2, 5, 2),  # one model delta per edge round
])
def test_quantized_algorithm_learns_with_packed_bytes(hfl_testbed, algorithm, tau, gamma, uploads):
    tb = hfl_testbed(overrides=SMALL + QSGD + [f"run.algorithm={algorithm}", f"train.tau={tau}",
                                               f"train.gamma={gamma}", "run.rounds=3"])
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    accuracy = [r["accuracy"] for r in rows]
    assert summary["algorithm"] == algorithm and summary["rounds"] == 3
    assert accuracy[-1] > 0.5 and accuracy[-1] > accuracy[0], accuracy  # chance is 0.1
    assert all(r["refused"] == 0 and r["devices"] == DEVICES for r in rows)
    # measured q per tier: whole-vector QSGD on d ~ 29k is far from exact, and s2 > s1 quantizes more finely
    assert all(1 < r["q_uplink"] and 0 < r["q_backhaul"] < r["q_uplink"] for r in rows)
    assert_packed(rows, summary["model_parameters"], [uploads] * 3)
    # the virtual clock of paper 001's latency model on the model trained (latency.time_base = "model", the
    # default): Table III's radio and CPU with d of this model and D = batch x 784 x 8 bits
    dim = summary["model_parameters"]
    t_cp, t_de, t_ec = lo.model_link_times(dim, tb.cfg.train.batch_size, 28 * 28)
    assert summary["tau_gamma"]["time_base"]["source"] == "model" and summary["tau_gamma"]["time_base"]["d"] == dim
    d = dict(t_cp=t_cp, t_de=t_de, t_ec=t_ec)
    per_round = (lo.round_latency(tau, gamma, **d) if algorithm == "qhetfed"
                 else lo.hier_local_qsgd_latency(tau, gamma, **d))
    assert [r["virtual_seconds"] for r in rows] == pytest.approx([per_round * (i + 1) for i in range(3)])
    assert summary["tau_gamma"]["mode"] == "fixed" and summary["tau_gamma"]["tau"] == tau


def test_auto_tau_gamma_records_its_choice(hfl_testbed):
    # A deadline that leaves (tau, gamma) in {(1, 4), (2, 2)}, small enough for a test; (2, 2) wins for q1 < 5.33
    # (k = C (1 + q1) / N), so at QSGD's q1 ~ 25 every round takes (1, 4). Each recorded choice must be the
    # optimiser's at the q1 the cloud recorded.
    latency = dict(t_cp=1.0, t_de=1.0, t_ec=2.0, deadline=8.0)
    tb = hfl_testbed(overrides=SMALL + QSGD + [
        "run.algorithm=qhetfed", "run.rounds=3", "latency.auto_tau_gamma=true", "train.tau=50", "train.gamma=50",
        "latency.time_base=config", f"latency.t_cp_s={latency['t_cp']}", f"latency.t_de_s={latency['t_de']}", f"latency.t_ec_s={latency['t_ec']}",
        f"latency.deadline_s={latency['deadline']}"])
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    record = summary["tau_gamma"]
    assert record["mode"] == "auto" and [c["round"] for c in record["choices"]] == [0, 1, 2]
    # before any measurement: the QSGD bound for s1 on the whole model; afterwards the previous round's q_uplink
    dim = summary["model_parameters"]
    assert rows[0]["q1_source"] == "theory" and rows[0]["q1_used"] == pytest.approx(min(dim / S1 ** 2, dim ** 0.5 / S1))
    assert "QSGD bound" in record["choices"][0]["q1_detail"]
    for prev, row in zip(rows, rows[1:]):
        assert row["q1_source"] == "measured" and row["q1_used"] == pytest.approx(prev["q_uplink"])
    assert record["q1_sources"] == ["measured", "theory"]
    virtual = 0.0
    for row in rows:
        choice = lo.choose_tau_gamma(latency["deadline"], latency["t_cp"], latency["t_de"], latency["t_ec"],
                                     num_edges=EDGES, num_devices=DEVICES, q1=row["q1_used"])
        assert (row["tau"], row["gamma"]) == (choice.tau, choice.gamma)
        virtual += choice.latency
        assert row["virtual_seconds"] == pytest.approx(virtual) and choice.latency <= latency["deadline"]
    # the chosen tau reached the devices: each made tau + 1 uploads that round (train.tau = 50 was not used)
    assert_packed(rows, dim, [row["tau"] + 1 for row in rows])
    assert rows[-1]["accuracy"] > 0.3, [r["accuracy"] for r in rows]


def test_auto_tau_gamma_from_the_emulated_clock(hfl_testbed):
    # latency.source = "emulated": from round 1 the cloud plugs the previous round's emulated t_CP (slowest SGD
    # step), t_DE (slowest upload) and t_EC (slowest backhaul) into paper 001's optimiser for a 2 s deadline
    tb = hfl_testbed(overrides=SMALL + QSGD + ["run.algorithm=qhetfed", "run.rounds=3", "latency.auto_tau_gamma=true",
                                               "latency.source=emulated", "latency.deadline_s=2.0"])
    summary = tb.wait(timeout=300)
    rows = tb.metrics()
    assert rows[0]["latency_source"].startswith("configured") and (rows[0]["tau"], rows[0]["gamma"]) == (2, 5)
    for prev, row in zip(rows, rows[1:]):
        assert row["latency_source"] == "emulated"
        assert (row["t_cp_s_used"], row["t_de_s_used"], row["t_ec_s_used"]) == pytest.approx(
            (prev["t_cp_emulated"], prev["t_de_emulated"], prev["t_ec_emulated"]))
        chosen = lo.choose_tau_gamma(2.0, row["t_cp_s_used"], row["t_de_s_used"], row["t_ec_s_used"], num_edges=EDGES,
                                     num_devices=DEVICES, q1=row["q1_used"])
        assert (row["tau"], row["gamma"]) == (chosen.tau, chosen.gamma)
    assert summary["tau_gamma"]["mode"] == "auto"
