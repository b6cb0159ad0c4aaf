"""Wireless physics of the emulator as pure functions: MCP-H geometry, Rayleigh fading, truncated channel
inversion, over-the-air superposition with interference, MultiAirFed's receive factors, and the clock.
No torch here: edges import this package."""
from .geometry import Topology, matern_cluster
from .ota import OtaParams, medium_broadcast, medium_slot

__all__ = ["Topology", "matern_cluster", "OtaParams", "medium_slot", "medium_broadcast"]
