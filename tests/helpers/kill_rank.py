"""A torchrun worker that runs `vlens ARGS` and kills rank 1 (SIGKILL) after VLENS_TEST_KILL_AFTER of its units."""

from __future__ import annotations

import os
import signal
import sys

from vlens.parallel import sharding as sharding_module


def _install() -> None:
    limit = int(os.environ["VLENS_TEST_KILL_AFTER"])
    original = sharding_module.Sharding.map

    def map_then_die(self, units, fn, *args, **kwargs):
        done = [0]

        def counted(unit):
            if self.rank == 1 and done[0] >= limit:
                os.kill(os.getpid(), signal.SIGKILL)
            done[0] += 1
            return fn(unit)

        return original(self, units, counted, *args, **kwargs)

    sharding_module.Sharding.map = map_then_die


if __name__ == "__main__":
    from vlens.cli import main

    _install()
    sys.exit(main(sys.argv[1:]))
