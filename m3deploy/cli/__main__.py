"""`python3 -m m3deploy.cli`: the m3deploy command."""
from m3deploy.cli import main

main()
