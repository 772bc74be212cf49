"""Inside a pyinfra run: the plan for the run (context). The components are roles/, beside deploy.py."""
