"""Pure optimisers of the run-time controllers (today: H2FDP(ctrl), paper 000 Alg. 1, in `h2fdp_ctrl`)."""
