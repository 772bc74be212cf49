"""Requests through the frontend: models, chat, stream, completions, thinking modes, tools,
session affinity, unknown model 404."""
GROUPS = ("smoke",)


def test_smoke(check, run_check):
    run_check(check)
