"""Every planned systemd unit is loaded, active and enabled."""
GROUPS = ("unit",)


def test_unit(check, run_check):
    run_check(check)
