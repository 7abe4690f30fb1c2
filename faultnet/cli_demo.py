"""Placeholder: `faultnet demo` (issue 5) register here."""


def register(sub) -> None:  # noqa: ANN001
    pass
