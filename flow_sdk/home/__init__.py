"""What this machine keeps in its flow data directory (``$FLOW_HOME``, default ``~/.flow``) about
the tasks and pools it launched: each one's secret (``tasksecrets``, 0600) and each pool's file
(``poolfiles``). The client, ``flow gc`` (through ``lifecycle``) and the providers that seal a
launch read them; nothing here leaves this machine."""
