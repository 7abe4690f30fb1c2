"""What vulture cannot see used: names read by a framework, by name, or by a user.

tests/test_dead_code.py passes this file to vulture beside the packages, so each name
below counts as referenced. Vulture matches names, not objects: an entry covers every
definition of that name, so keep each one rare and give its reason. (Patterns live in
the test's IGNORE_NAMES.) This file is read by vulture, never imported.
"""

# ruff: noqa: B018
from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# pytest calls its hooks by name (faultnet.pytest_plugin, via the pytest11 entry point).
_.pytest_addoption
_.pytest_configure
_.pytest_report_header

# Attributes set on third-party objects that read them: hypercorn's Config (the tests'
# upstream server, tests/faultnet/http_app.py) and starlette's Router.
_.accesslog
_.errorlog
_.graceful_timeout
_.keep_alive_timeout
_.read_timeout
_.redirect_slashes

# http.server's handler protocol (harness/fidelity/_world.py): the server calls do_GET
# and log_message, reads close_connection and daemon_threads.
_.do_GET
_.log_message
_.close_connection
_.daemon_threads

# The kernel's faults (harness/fidelity/_world.py), named by a fidelity case as a string
# (harness/fidelity/_cases.py: _nft("drop_syns")) and called by getattr.
_.drop_both_ways
_.drop_syns
_.reject_with_reset

# Chaos Toolkit (faultnet/chaostoolkit): discover() is called with discover_system=;
# an action's __module__ and __signature__ are what its discovery reads.
_.discover_system
_.__module__
_.__signature__

# Counters of the UDP proxy (faultnet/udp/proxy.py) read by name: the session's counts
# are asdict()'d into the API's JSON and the event log.
_.oversize_dropped
_.hold_overflow
_.queue_overflow
_.cut_on_receive

# Fields of records written out by name (dataclasses.asdict into JSON) or filled from a
# row by position: the fidelity observation, the experiment result, the bot registry.
_.bytes_after
_.duration_s
_.created_at

# A toxic attribute (faultnet/toxics/tls.py): the API reads a toxic's attributes by the
# names its ATTRIBUTES declare, so ca_cert is answered to the client.
_.ca_cert

# Public counters of the drivers, documented (#:) for their users; no test reads them
# yet (drivers/irc/_observer.py, drivers/mcp/_process.py).
_.unparsed
_.stderr_dropped

# argparse expands an action's own attributes in its help: "%(toxic_types)s"
# (faultnet/server/cli.py, the toxic types listed when the help is shown).
_.toxic_types

# A key of faultnet/chaostoolkit/__init__.py's Server (a TypedDict): the activities
# pass it by keyword (api_url_=...) and api_request reads it by name.
_.api_url_
