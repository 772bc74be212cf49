"""Each service's readiness URL answers (etcd healthy, NATS JetStream, frontend live, worker system
port), and the frontend's /health lists every planned worker instance."""
GROUPS = ("health", "instances")


def test_health(check, run_check):
    run_check(check)
