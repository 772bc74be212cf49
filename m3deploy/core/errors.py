"""Errors users see: what is wrong, where (host, key, file), and how to fix it."""


class M3Error(Exception):
    """A user-facing error. str() is the message to print."""


class ValidationError(M3Error):
    """One or more plan validation problems; `.problems` holds each message."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))

