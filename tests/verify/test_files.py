"""Env files are 0600 root:root; no secret value in world-readable files; the controller's store is 0600."""
GROUPS = ("file", "secrets")


def test_file(check, run_check):
    run_check(check)
