"""`gpuhook config check`: validate the node config (owned by the policy work)."""


def add_commands(sub) -> None:
    pass
