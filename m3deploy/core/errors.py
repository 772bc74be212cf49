"""Errors users see: what is wrong, where (host, key, file), and how to fix it."""


class M3Error(Exception):
    """A user-facing error. str() is the message to print."""


class ValidationError(M3Error):
    """One or more plan validation problems; `.problems` holds each message."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))



def plural(n: int, word: str, many: str = "") -> str:
    """A count and its noun, for every message that counts: '1 host', '2 hosts', '0 hosts'; `many` where the plural
    is not word + 's' ('1 process', '2 processes')."""
    return f"{n} {word if n == 1 else many or word + 's'}"
