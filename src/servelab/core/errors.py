"""User-facing errors: the CLI prints them without a traceback and exits with status 2."""


class ServelabError(Exception):
    """Bad input or an impossible request. The message names the file, the field and the fix."""
