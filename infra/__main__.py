"""Two entry points in one file, as Pulumi.yaml's `main: infra/` and `python -m infra` both need:

- run by the Pulumi engine (a resource monitor is configured): the Pulumi program;
- run from a shell: the command line (`python -m infra render|promote|rollback|...`).
"""
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # so `components` and `infra` import, however the program is started

import pulumi.runtime.settings  # noqa: E402

if pulumi.runtime.settings.get_monitor() is not None:
    from infra.program import main

    main()
elif __name__ == "__main__":
    import gc

    from cloudstation_tools.cli import main as cli

    status = cli()
    # Exiting: everything still allocated lives until now, and the interpreter's final collections
    # over it cost ~0.4 s of CPU after a render; frozen objects are skipped.
    gc.freeze()
    sys.exit(status)
