"""Checking hosts against the plan: preflight (facts), verify (ssh, checks, report), smoke requests, readiness."""
