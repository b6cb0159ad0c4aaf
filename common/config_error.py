"""The error of a bad configuration: raised by the config loader, its validators and the plugins it loads."""


class ConfigError(ValueError):
    pass
