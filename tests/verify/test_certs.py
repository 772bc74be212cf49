"""Every certificate the controller can see has more days left than the renewal window and is strict X.509."""
GROUPS = ("cert",)


def test_cert(check, run_check):
    run_check(check)
