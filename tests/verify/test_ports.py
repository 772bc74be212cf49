"""Every planned port listens on its planned address (and on no wildcard address unless planned)."""
GROUPS = ("port",)


def test_port(check, run_check):
    run_check(check)
