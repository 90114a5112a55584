"""``python -m rexmle_baselines run ...``: the ``rexmle baselines`` command without the ``rexmle`` front end."""

import sys

from rexmle_grade.cli import main

if __name__ == "__main__":
    sys.exit(main(["baselines", *sys.argv[1:]]))
