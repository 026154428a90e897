"""The node-side program: one agent per node, one worker process per slot."""
