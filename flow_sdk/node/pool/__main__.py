from flow_sdk.node.pool.daemon import main
from flow_sdk.system.procs import exit_now

exit_now(main())
