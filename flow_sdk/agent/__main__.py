import sys

from flow_sdk.agent.main import main

sys.exit(main())
