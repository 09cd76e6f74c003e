"""`gpuhook agent`, `gpuhook cdi generate`, `gpuhook log` (owned by the agent work)."""


def add_commands(sub) -> None:
    pass
