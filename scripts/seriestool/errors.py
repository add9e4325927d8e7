"""The one error type the tooling raises for bad input or a refused operation."""


class SeriesError(Exception):
    """A refusal or failure to report to the user, naming the input and the fix;
    the CLI prints it and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
