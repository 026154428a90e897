"""``flow ui``: a local web dashboard over the same records the ``flow`` command reads.

It serves on 127.0.0.1 under a random host name of its own (``flow-<hex>.localhost``) with a
random token in its URL (as Jupyter does); every request without that token (or the cookie
the first visit sets, which no other server of this machine receives) is refused with 403.
Every page is a Jinja2 template with autoescape on; a Content-Security-Policy lets the page
run only the package's own script file. Pages: the tasks (live), one task (its nodes'
phases, its timeline drawn as SVG, its logs streamed as server-sent events, its error and
stacks, cancel), the pools and the volumes.

One module per job: ``deps`` (the web packages, or the line that says how to get them),
``auth`` (the token and the host name), ``policy`` (the headers every answer carries),
``render`` (the templates), ``views`` (what a page shows, read through the public API),
``svg`` (the timeline), ``pages`` and ``taskpage`` (the pages), ``streams`` (the
server-sent events), ``opener`` (``--open``'s redirect file), ``server`` (the routes and
``serve``). Nothing here is imported by the rest of the SDK; ``flow ui`` imports it when it
runs, so the web packages (the ``ui`` extra) are needed only then.
"""
