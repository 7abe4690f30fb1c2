"""Placeholder: the server's commands (issue 6) register here."""


def register(sub) -> None:  # noqa: ANN001
    pass
