"""faultnet.lazyexports: a package's names load on first read, and only then."""

from __future__ import annotations

import subprocess
import sys


def test_a_name_loads_its_module_on_first_read_and_nothing_before() -> None:
    code = (
        "import sys, faultnet.chaos as c\n"
        "assert 'faultnet.chaos._run' not in sys.modules\n"
        "assert c.Runner.__module__ == 'faultnet.chaos._run'\n"
        "assert 'faultnet.chaos._run' in sys.modules and 'Runner' in vars(c)\n"
        "assert c._rails.__name__ == 'faultnet.chaos._rails'  # a submodule\n"
        "for bad in ('nope', '__wrapped__'):\n"
        "    try:\n"
        "        getattr(c, bad)\n"
        "    except AttributeError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(bad)\n"
        "assert 'Runner' in dir(c)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
