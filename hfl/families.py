"""The built-in families, imported once by every entry point (the CLI and so every node, docgen, the sweep, the
testbed and the test suite).

The engine (common.config, wire, pipeline, plans, modes) defines registries and imports no family; each family adds
its config sections, checks, algorithms, stages and codecs to them from its own package when imported here, the way
a plugin (`run.plugins`, docs/plugins.md) adds its own. The order of the imports is the order in which the families'
config checks run.
"""
from hfl.common import privacy  # noqa: F401  (clip and noise stages, the fixed-denominator aggregator)
from hfl.common.privacy import config as _privacy_config  # noqa: F401  ([privacy] and its checks)
from hfl.common.privacy import algorithms as _privacy_algorithms  # noqa: F401
from hfl.common.quantization import codecs as _quantization_codecs  # noqa: F401  (qsgd, sq, dpsq, laplace-sq)
from hfl.common.quantization import config as _quantization_config  # noqa: F401  ([precision], [latency]'s checks)
from hfl.common.quantization import algorithms as _quantization_algorithms  # noqa: F401
from hfl.common.control import config as _control_config  # noqa: F401  ([control] and its check)
from hfl.common.channel import config as _channel_config  # noqa: F401  ([channel], [clock], the mode's channel)
from hfl.common.channel import algorithms as _channel_algorithms  # noqa: F401
from hfl.common.config import register_section, register_validator
from hfl.common.observe.config import ObserveSection, validate_observe

register_section("observe", ObserveSection, after="control")  # the live page's package stays free of registrations
register_validator(validate_observe)
