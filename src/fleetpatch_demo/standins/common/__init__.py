"""What every engine's stand-in shares; installed on a host as ``fleetpatch_standin_common``.

An engine's stand-in imports these modules by that absolute name
(``from fleetpatch_standin_common.stubs import StubBase``):

* ``stubs``: a ``sys.meta_path`` finder serving permissive stub modules for what the host
  lacks (torch, triton, ...) and the ``Stub`` values they hold; the engine says which
  modules and which concrete names through a ``StubRules`` given to ``install_stubs``.
* ``httpserver``: the threading HTTP server and a uvicorn-like request handler base.
* ``output``: flushing and line-buffering stdout/stderr, logrotate-style log rotation,
  reading the stand-ins' FLEETPATCH_STANDIN_* variables.
* ``serving``: SIGINT/SIGTERM as a ``Stop`` exception, and the serving phase's loop
  (fatal exit, graceful drain, a scheduled death).

Stdlib only; Python 3.8+.
"""
