import sys

from flow_sdk.node.pool.daemon import main

sys.exit(main())
