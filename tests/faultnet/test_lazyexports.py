"""faultnet.lazyexports: a package's names load on first read, and only then."""

from __future__ import annotations

import subprocess
import sys

#: Each check runs in a fresh interpreter (what is imported is the point), after this.
PROLOGUE = (
    "import sys\n"
    "def missing(module, name):\n"
    "    try:\n"
    "        getattr(module, name)\n"
    "    except AttributeError:\n"
    "        return True\n"
    "    return False\n"
)


def run_fresh(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROLOGUE + code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_name_loads_its_module_on_first_read_and_nothing_before() -> None:
    run_fresh(
        "import faultnet.chaos as c\n"
        "assert 'faultnet.chaos._run' not in sys.modules\n"
        "assert c.Runner.__module__ == 'faultnet.chaos._run'\n"
        "assert 'faultnet.chaos._run' in sys.modules and 'Runner' in vars(c)\n"
        "assert c._rails.__name__ == 'faultnet.chaos._rails'  # a submodule\n"
        "assert missing(c, 'nope') and missing(c, '__wrapped__')\n"
        "assert 'Runner' in dir(c)\n"
    )


def test_a_listed_module_is_read_only_for_a_name_it_lists() -> None:
    # faultnet.udp exports every name faultnet.udp.controls.__all__ lists (everything_in).
    run_fresh(
        "import faultnet.udp as u\n"
        "assert u.modes.__name__ == 'faultnet.udp.modes'  # a submodule\n"
        "assert 'faultnet.udp.controls' not in sys.modules\n"
        "import faultnet.udp.controls as c\n"
        "name = c.__all__[0]\n"
        "assert getattr(u, name) is getattr(c, name)\n"
        "assert set(c.__all__) <= set(u.__all__) and 'UdpProxy' in u.__all__\n"
        "assert set(c.__all__) <= set(dir(u))\n"
        "assert missing(u, 'nope')\n"
        "import faultnet as f\n"
        "assert '__version__' in f.__all__ and 'assert_frozen' in f.__all__\n"
    )
