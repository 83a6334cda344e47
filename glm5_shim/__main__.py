import sys

from glm5_shim.cli import main

sys.exit(main())
