"""``flow ui``: the local web dashboard (``flow_sdk.client.dashboard``).

    flow ui                  # http://flow-<hex>.localhost:PORT/?token=... until Ctrl-C
    flow ui --port 8765 --open
"""

from __future__ import annotations

import click

from flow_sdk.cli._main import main


@main.command(name="ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Only this machine can reach the default; another "
                   "address lets anyone who reaches it and holds the token see and cancel "
                   "your tasks (a warning says so).")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Port to listen on (default: a free one).")
@click.option("--open", "open_browser", is_flag=True,
              help="Open the page in your browser, through a page in FLOW_HOME only you can "
                   "read (the token stays off the process list).")
def ui(host: str, port: int, open_browser: bool) -> None:
    """Serve a web dashboard of this machine's tasks, pools and volumes: live status, node
    phases, timelines, logs, errors, stacks and cancel. It prints its URL, with a host name
    of its own under localhost and a random token the page needs, and runs until Ctrl-C."""
    from flow_sdk.client.dashboard.deps import require_web_packages

    require_web_packages()
    from flow_sdk.client.dashboard.server import serve

    serve(host, port, open_browser, say=click.echo,
          warn=lambda line: click.echo(f"flow: warning: {line}", err=True))
