"""prestage's exceptions. Each also derives from the builtin exception users expect to catch."""


class Error(Exception):
    """Base of every error prestage raises."""


class ConfigError(Error, ValueError):
    """An option or argument is invalid; the message names it."""


class IoError(Error, OSError):
    """A file could not be opened, read or written: ``errno`` and ``filename`` are set."""


class DecodeError(Error, ValueError):
    """A sample's bytes could not be decoded: ``path`` names the file and ``reason`` says why."""

    path: str = ""
    reason: str = ""


__all__ = ["Error", "ConfigError", "IoError", "DecodeError"]
