"""`m3deploy save-images INVENTORY DIRECTORY`: `docker save` every image the plan runs, for air-gapped hosts."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from m3deploy.cli import fail, load
from m3deploy.cli.options import data_option, inventory_argument, say, verbosity_options
from m3deploy.controller import prepare
from m3deploy.controller.images import images_to_save, save
from m3deploy.core.errors import M3Error, plural


@click.command("save-images", short_help="docker save every image the plan runs, for air-gapped hosts.")
@inventory_argument
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Save again even if the archive exists.")
@data_option
@verbosity_options
def save_images(inventory, directory, force, data):
    """Pull (or, for m3deploy's own images, build) and `docker save` every image the plan runs into DIRECTORY,
    for air-gapped hosts."""
    try:
        plan = load(inventory, data)[1]
        images = images_to_save(plan)
        for need in prepare.needs(plan):
            if need.kind == "sim-image":  # the stand-in engine image is built here, not pulled
                prepare.ensure(need, log=say)
        if not images:
            say(f"{inventory}: the plan runs no container image (nothing to save)")
            return
        save(images, Path(directory), force=force, log=say)
    except M3Error as e:
        fail(e)
    extra = "".join(f" --data {d}" for d in data)
    click.echo(f"saved {plural(len(images), 'image')} to {directory}. Deploy with:\n"
               f"  pyinfra -y {inventory} deploy.py{extra} "
               f"--data m3_image_archive_dir={Path(directory).resolve()}", file=sys.stdout)

