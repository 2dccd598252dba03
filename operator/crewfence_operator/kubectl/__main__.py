"""``python -m crewfence_operator.kubectl``: the same entry as the ``kubectl-crewfence`` script."""

import sys

from crewfence_operator.kubectl.main import main

sys.exit(main())
