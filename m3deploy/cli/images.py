"""`m3deploy save-images INVENTORY DIRECTORY`: `docker save` every image the plan runs, for air-gapped hosts."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from m3deploy.cli import fail, load_plan
from m3deploy.controller.images import images_to_save, save
from m3deploy.core.errors import M3Error


@click.command("save-images")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Save again even if the archive exists.")
def save_images(inventory, directory, force):
    """Pull and `docker save` every image the plan runs into DIRECTORY, for air-gapped hosts."""
    try:
        plan = load_plan(inventory)
        images = images_to_save(plan)
        if not images:
            click.echo(f"{inventory}: the plan runs no container image (nothing to save)")
            return
        save(images, Path(directory), force=force, log=click.echo)
    except M3Error as e:
        fail(e)
    click.echo(f"saved {len(images)} image(s) to {directory}. Deploy with:\n  pyinfra -y {inventory} deploy.py "
               f"--data m3_image_archive_dir={Path(directory).resolve()}", file=sys.stdout)
