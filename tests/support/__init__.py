"""What the test modules share, other than fixtures (those stay in conftest.py).

tests/ is on sys.path (pyproject.toml: [tool.pytest.ini_options] pythonpath), so a
test module imports `from support.operator import Operator`. No test module imports
`conftest` or another test module (tests/fast/test_suite_layout.py checks it).

  paths        REPO, TESTS, FIXTURE_PATCHES, sha256 of a file
  marks        skip marks for what a machine lacks: sshd hosts (needs_fleet), root (needs_root)
  operator     Operator/Run: the installed program run as an operator does, over a test fleet
  localhost    LocalHost: a host that is a directory, reached by the local transport
  agent_session  one agent session on a LocalHost, driven by hand
  listeners    a loopback TCP server whose behaviour per client is given
  hostile      terminal escapes and rich markup, as hostile host data
  toy_engine   a second engine profile, "toyserve", that exists only in the tests
  clockstep    a host whose wall clock can be stepped (libfaketime)
"""
