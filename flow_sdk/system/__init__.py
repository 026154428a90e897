"""This machine's operating system, standard library only, for both sides: processes (``procs``:
start times, process groups, free ports, who carries an environment variable) and private
mount namespaces (``mountns``). The local nodes' keeper loads ``procs`` by its path."""
