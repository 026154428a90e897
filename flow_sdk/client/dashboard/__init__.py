"""``flow ui``: a local web dashboard over the same records the ``flow`` command reads.

It serves on a loopback address with a random token in its URL (as Jupyter does); every
request without that token (or the cookie the first visit sets) is refused with 403. Pages:
the tasks (live), one task (its nodes' phases, its timeline drawn as SVG, its logs streamed
as server-sent events, its error and stacks, cancel), the pools and the volumes.

One module per job: ``deps`` (the web packages, or the line that says how to get them),
``auth`` (the token), ``views`` (what a page shows, read through the public API), ``svg``
(the timeline), ``pages`` (HTML), ``streams`` (the server-sent events), ``server`` (the
routes and ``serve``). Nothing here is imported by the rest of the SDK; ``flow ui`` imports
it when it runs, so the web packages (the ``ui`` extra) are needed only then.
"""
