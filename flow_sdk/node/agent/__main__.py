from flow_sdk.node.agent.main import main
from flow_sdk.system.procs import exit_now

exit_now(main())
