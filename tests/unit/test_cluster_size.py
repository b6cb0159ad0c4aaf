"""Cluster sizes of paper 004 (eq. 27): CSO and random draws over the feasible set (digest 004, 5.3 and 9.6)."""
import numpy as np
import pytest

from hfl.common.quantization import cluster_size as cs

# Paper defaults (digest 004 section 5.3): C = 10, b = (2, 4), sigma = (6.25e-4, 0.125), N = 10, B = 30, g = (50, 50).
DEFAULTS = dict(group_sizes=(50, 50), bits=(2, 4), participants=10, budget=30)


def test_feasible_set_of_the_defaults():
    sizes = cs.feasible_cluster_sizes(**DEFAULTS)
    assert sorted(map(tuple, sizes)) == [(5, 5), (6, 4), (7, 3), (8, 2), (9, 1)]


def test_cso_returns_5_5_on_the_paper_defaults():
    # Digest 004 9.6 / 5.3: per-device costs 88.89 (2-bit) and 3.571 (4-bit), optimum (5, 5) with objective 462.3.
    costs = cs.cso_group_cost((2, 4), (6.25e-4, 0.125), clip=10)
    assert costs == pytest.approx([800 / 9 + 6.25e-4 ** 2, 800 / 225 + 0.125 ** 2])
    choice = cs.cso_cluster_sizes(DEFAULTS["group_sizes"], (2, 4), (6.25e-4, 0.125), participants=10, budget=30,
                                  clip=10)
    assert choice.sizes == (5, 5) and choice.bits_used == 30 and choice.mode == "cso"
    assert choice.objective == pytest.approx(462.3, abs=0.05)
    # Same optimum at sigma_2 = 0.0125 (digest 004 5.3), and with per-device stds.
    assert cs.cso_cluster_sizes((50, 50), (2, 4), (6.25e-4, 0.0125), participants=10, budget=30, clip=10).sizes == (5, 5)
    per_device = (np.full(50, 6.25e-4), np.full(50, 0.125))
    assert cs.cso_cluster_sizes((50, 50), (2, 4), per_device, participants=10, budget=30, clip=10).sizes == (5, 5)


def test_cso_matches_exhaustive_search_on_three_groups():
    g, b, stds = (4, 6, 5), (1, 3, 8), (0.5, 0.2, 2.0)
    choice = cs.cso_cluster_sizes(g, b, stds, participants=9, budget=40, clip=1.0)
    costs = cs.cso_group_cost(b, stds, 1.0)
    best = min(((c1, c2, 9 - c1 - c2) for c1 in range(1, 5) for c2 in range(1, 7)
                if 1 <= 9 - c1 - c2 <= 5 and c1 * 1 + c2 * 3 + (9 - c1 - c2) * 8 <= 40),
               key=lambda c: float(np.dot(c, costs)))
    assert choice.sizes == best


def test_noisy_high_precision_links_push_cso_to_low_bits():
    # If the 4-bit links are very noisy, the objective (linear in c_m) prefers as many 2-bit devices as possible.
    choice = cs.cso_cluster_sizes((50, 50), (2, 4), (6.25e-4, 20.0), participants=10, budget=30, clip=10)
    assert choice.sizes == (9, 1)


def test_random_cluster_sizes_are_uniform_over_the_feasible_set():
    # 5 feasible pairs, 5000 seeded draws: each frequency ~ 0.2 with std sqrt(0.16/5000) = 0.0057; allow 4 std.
    rng = np.random.default_rng(0)
    draws = [cs.random_cluster_sizes(**DEFAULTS, rng=rng).sizes for _ in range(5000)]
    values, counts = np.unique(np.array(draws), axis=0, return_counts=True)
    assert sorted(map(tuple, values)) == [(5, 5), (6, 4), (7, 3), (8, 2), (9, 1)]
    np.testing.assert_allclose(counts / 5000, 0.2, atol=4 * 0.0057)


def test_infeasible_budget_names_the_budget():
    with pytest.raises(ValueError, match=r"bit budget B = 19 .*needs sum b_m c_m = 22"):
        cs.cso_cluster_sizes((50, 50), (2, 4), (6.25e-4, 0.125), participants=10, budget=19, clip=10)
    with pytest.raises(ValueError, match="bit budget"):
        cs.random_cluster_sizes((50, 50), (2, 4), participants=10, budget=0, rng=np.random.default_rng(0))


@pytest.mark.parametrize("kwargs,name", [
    (dict(group_sizes=(50, 50), bits=(2, 17), participants=10, budget=30), "bits"),
    (dict(group_sizes=(50, 50), bits=(2,), participants=10, budget=30), "bits"),
    (dict(group_sizes=(50, 50), bits=(2, 4), participants=1, budget=30), "participants"),
    (dict(group_sizes=(5, 5), bits=(2, 4), participants=11, budget=300), "participants"),
    (dict(group_sizes=(0, 5), bits=(2, 4), participants=3, budget=30), "group_sizes"),
])
def test_bad_inputs_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        cs.feasible_cluster_sizes(**kwargs)
