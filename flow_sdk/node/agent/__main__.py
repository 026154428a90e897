import sys

from flow_sdk.node.agent.main import main

sys.exit(main())
