"""``python -m kimi_deploy`` runs the CLI."""

from kimi_deploy.cli import main

main()
